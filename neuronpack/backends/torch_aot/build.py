"""Build a portable artifact: weights once in the recipe dtype, every bucket's graph in one ``graphs.pt2``.

Files written into the staging directory (the pipeline adds ``neuronpack.json``)::

    graphs.pt2           AOTInductor package (layer and head graphs, weights are their inputs) or exported programs
    weights/             model.safetensors (+ shards/index) in the recipe dtype, and a copy of config.json
    draft/               [speculation] kind = "eagle": the converted EAGLE draft (its weights; graphs.pt2 holds its
                         compiled draft_step and draft_head graphs)
    lora/<name>/         with [lora]: each PEFT adapter as given (stacked into the layers' lora_A / lora_B at load)
    neuron_config.json   the ArtifactConfig (artifact_config.py): batch, lengths, buckets, dtype, compiler,
                         target, graphs: what the loader needs
    config.json, tokenizer files, generation_config.json

Example::

    info = build_artifact(BuildRequest(model_dir, recipe, plan, staging))
    info["bucket_seconds"]   # {"layer_decode": 9.1, "layer_step": 11.4, "head": 3.2}: seconds per graph
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.backends.torch_aot import layout as L
from neuronpack.backends.torch_aot.artifact_config import ArtifactConfig, SpeculationSection, write_artifact_config
from neuronpack.backends.torch_aot.compile import compile_graphs
from neuronpack.backends.torch_aot.layout import DRAFT_DIR, WEIGHTS_DIR
from neuronpack.backends.torch_aot.lora import (
    attach_artifact_lora,
    check_lora_recipe,
    copy_artifact_adapters,
    lora_section,
)
from neuronpack.backends.torch_aot.target import current_target, effective_compiler
from neuronpack.errors import CheckpointError, RecipeError
from neuronpack.models.config import ModelConfig
from neuronpack.models.loading import resolve_dtype
from neuronpack.models.registry import family

if TYPE_CHECKING:
    from neuronpack.backends.base import BuildRequest


def artifact_config(request: BuildRequest) -> ArtifactConfig:
    """What is compiled, and how (torch-free): the portable equivalent of NxDI's neuron_config.json, before the
    build completes it (``ArtifactConfig.built``).

    Example: ``artifact_config(request).context_encoding_buckets == (128, 256)``.
    """
    recipe, plan = request.recipe, request.plan
    check_recipe(recipe)
    hf = read_hf_config(request.model_dir)
    cfg = ModelConfig.from_hf(hf, max_seq_len=plan.seq_len)
    dtype = resolve_dtype(recipe.model.dtype, family(cfg.family).text_config(hf))
    compiler = effective_compiler(recipe.compiler)
    return ArtifactConfig(
        compiler=compiler,
        batch_size=recipe.target.batch_size,
        ctx_batch_size=1,
        tkg_batch_size=recipe.target.batch_size,
        seq_len=plan.seq_len,
        max_context_length=plan.max_context_length,
        max_length=plan.seq_len,
        enable_bucketing=recipe.buckets.enabled,
        context_encoding_buckets=tuple(plan.context),
        token_generation_buckets=tuple(plan.token_generation),
        torch_dtype=dtype,
        kv_cache_dtype=dtype,
        tp_degree=1,
        padding_side="right",
        is_continuous_batching=True,
        quantized=recipe.quantization is not None,
        quantization_dtype=recipe.quantization.dtype if recipe.quantization else None,
        model_type=cfg.model_type,
        num_layers=cfg.num_layers,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        kv_cache_positions=L.cache_positions(plan.seq_len),
        vocab_size=cfg.vocab_size,
        # Tokens (and logits) per row one step runs: the longest prompt, at least speculation length + 1 (verify).
        max_step_tokens=max(plan.max_context_length, (recipe.speculation.length + 1) if recipe.speculation else 1),
        speculation=speculation_section(recipe, dtype),  # what the runtime speculates with (None: it does not)
        target=current_target(compiler, recipe.instance_for("torch")),
        lora=lora_section(recipe.lora, request.adapter_dirs()),
        kv_ring=kv_ring(cfg, plan.seq_len, recipe.speculation),
    )


def kv_ring(cfg: ModelConfig, seq_len: int, speculation) -> int | None:
    """Positions a sliding-window layer's cache row keeps: its window, plus room for the tokens a verify step
    writes past what it keeps (``speculation.length``), so no position inside a later step's window is
    overwritten; None when that is no shorter than the sequence (or no layer has a window)."""
    if cfg.sliding_window is None:
        return None
    ring = cfg.sliding_window + (speculation.length if speculation else 0)
    return ring if ring < seq_len else None


def speculation_section(recipe, dtype: str) -> SpeculationSection | None:
    """What the runtime speculates with (None: no speculation): kind, length, the n-gram sizes of prompt lookup, and
    for EAGLE the draft's directory inside the artifact and the dtype it runs in (the target's)."""
    spec = recipe.speculation
    if spec is None:
        return None
    if spec.kind == "eagle":
        return SpeculationSection(spec.kind, spec.length, draft=DRAFT_DIR, draft_dtype=dtype)
    return SpeculationSection(spec.kind, spec.length, prompt_lookup_min=spec.prompt_lookup_min,
                              prompt_lookup_max=spec.prompt_lookup_max)


def check_recipe(recipe) -> None:
    """Refuse recipe features the portable backend does not implement (one clear line each)."""
    unsupported = [
        (recipe.speculation is not None and recipe.speculation.kind == "draft",
         'speculation kind "draft"',
         'set [speculation] kind = "eagle" or "prompt_lookup", or use framework nxd for draft-model speculation'),
        (recipe.target.tp_degree != 1, "target.tp_degree > 1", "set target.tp_degree = 1 for the torch backend"),
        (bool(recipe.quantization and recipe.quantization.kv_cache), "quantization.kv_cache",
         "set quantization.kv_cache = false for the torch backend"),
        (recipe.instance_for("torch") != "cpu", f"target.instance {recipe.instance_for('torch')}",
         'set target.instance = "cpu" (the torch backend compiles for CPU)'),
    ]
    for bad, what, fix in unsupported:
        if bad:
            raise RecipeError(f"{what} is not supported by the torch backend", where="recipe", fix=fix)
    check_lora_recipe(recipe.lora)


def read_hf_config(model_dir: Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read config.json: {exc}", where=str(path),
                              fix="pass a Hugging Face checkpoint directory") from None


def build_artifact(request: BuildRequest) -> dict[str, Any]:
    """Write the whole artifact (everything but neuronpack.json) into ``request.staging``; return
    ``{"bucket_seconds": {...}, "compiler": "aoti" | "export", "graph_seconds": S}`` (the pipeline records
    ``graph_seconds``, the kernels' and graphs' share of the build, as the manifest's ``graphs.seconds``); with a
    donor's graphs ``{"compiler": ...}``."""
    import torch

    from neuronpack.backends.torch_aot.graphs import graph_names, layer_groups
    from neuronpack.checkpoint import copy_aux_files, open_checkpoint
    from neuronpack.models.loading import load_model

    planned = artifact_config(request)
    staging, reporter = Path(request.staging), request.reporter
    dtype = getattr(torch, planned.torch_dtype)
    model = load_model(open_checkpoint(request.model_dir), dtype, max_seq_len=request.plan.seq_len,
                       reporter=reporter)
    # AOTInductor graphs call neuronpack's decode kernels for their linears (models/linear_kernels.py); export-only
    # programs keep F.linear, which any torch runs.
    kernels = planned.compiler == "aoti"
    started = time.perf_counter()
    if kernels and request.donor is None:  # built here once per machine; the artifact ships a copy
        from neuronpack.kernels import machine_library

        with reporter.task("neuronpack kernels", total=1) as task:
            shutil.copy2(machine_library(), staging / L.KERNELS_LIBRARY)
            task.advance()
    graph_seconds = time.perf_counter() - started
    groups = layer_groups(model)  # layer -> its kind of layer graph (one kind unless some layers differ)
    names, draft, speculation = graph_names(groups), None, planned.speculation
    if speculation and speculation.kind == "eagle":  # checked before the compile
        draft = copy_eagle_draft(request.draft_dir, staging / DRAFT_DIR, dtype, target_layers=planned.num_layers)
        speculation = dataclasses.replace(speculation, layout="eagle3" if draft.eagle3 else "eagle1",
                                          target_layers=tuple(draft.target_layers) if draft.eagle3 else None)
        names += list(L.DRAFT_GRAPHS)
    config = planned.built(linear_kernels=kernels, layer_graphs=groups, speculation=speculation,
                           graphs={name: name for name in names})  # graph -> model name in graphs.pt2
    write_weights(model, request.model_dir, staging / WEIGHTS_DIR, reporter)
    shutil.copy2(Path(request.model_dir) / "config.json", staging / "config.json")
    copy_aux_files(request.model_dir, staging)
    copy_artifact_adapters(config.lora, request.adapter_dirs(), staging)
    attach_artifact_lora(model, config.lora, staging)  # after write_weights: the artifact keeps the PEFT copies only
    write_artifact_config(staging, config)
    if request.donor is not None:  # graphs.pt2 and the kernels are the donor's: the weights were all there was to do
        return {"compiler": config.compiler}
    started = time.perf_counter()
    seconds = compile_graphs(model, request.plan, config, staging, reporter, draft=draft)
    graph_seconds += time.perf_counter() - started
    return {"bucket_seconds": seconds, "compiler": config.compiler, "graph_seconds": round(graph_seconds, 3)}


def copy_eagle_draft(draft_dir: Path | None, out: Path, dtype, target_layers: int):
    """Copy the converted EAGLE draft (safetensors, index, config.json, convert-eagle's manifest) into the artifact,
    after loading it once as the runtime will (a draft the runtime cannot run fails the build here); returns it.
    ``target_layers``: the target's layer count (an EAGLE-3 draft reads three of its layers)."""
    from neuronpack.convert.eagle import MANIFEST
    from neuronpack.models.eagle import load_eagle_draft

    if draft_dir is None:
        raise RecipeError('speculation kind "eagle" needs a draft', where="recipe [speculation]",
                          fix="set speculation.draft to the EAGLE draft's directory")
    draft = load_eagle_draft(Path(draft_dir), dtype, target_layers=target_layers)
    out.mkdir(parents=True)
    for path in sorted(Path(draft_dir).iterdir()):
        if path.is_file() and (path.suffix == ".safetensors" or path.name in (
                "config.json", "model.safetensors.index.json", MANIFEST)):
            shutil.copy2(path, out / path.name)
    return draft


def write_weights(model, model_dir: Path, out: Path, reporter) -> None:
    """One safetensors copy of what the graphs read (tied lm_head stored once), plus config.json so ``out`` is
    itself an HF checkpoint."""
    from neuronpack.checkpoint import TensorSpec, write_safetensors_sharded

    out.mkdir(parents=True)
    tensors = {name: t.contiguous() for name, t in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    specs = [TensorSpec(name, t.dtype, tuple(t.shape)) for name, t in tensors.items()]
    write_safetensors_sharded(out, specs, iter(tensors.items()), reporter=reporter)
    hf = family(model.config.family).text_config(read_hf_config(model_dir))  # a multimodal checkpoint's decoder
    hf["tie_word_embeddings"] = model.config.tie_word_embeddings
    (out / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
