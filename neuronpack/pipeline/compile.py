"""`neuronpack compile` as a library call: a content-addressed, cached, atomic, concurrency-safe build.

Example::

    result = compile_model("./SmolLM2-135M-Instruct", recipe=Path("recipes/smollm2-135m-cpu.toml"))
    result.path        # <root>/neuron-compiled-artifacts/<key>
    result.cache_hit   # True the second time
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuronpack.artifacts.key import compute_key, directory_identity, key_inputs, toolchain_versions
from neuronpack.artifacts.manifest import build_manifest, write_manifest
from neuronpack.artifacts.store import artifacts_root, key_lock, new_staging, publish, record_failure
from neuronpack.artifacts.verify import quick_check
from neuronpack.backends.base import BuildRequest
from neuronpack.backends.select import NEURON_FRAMEWORKS
from neuronpack.errors import BackendUnavailableError, BuildError, NeuronpackError
from neuronpack.fsutil import remove_tree
from neuronpack.pipeline.inputs import ResolvedInputs, resolve_inputs
from neuronpack.pipeline.prepare import (
    converted_draft_path,
    ensure_eagle_draft,
    ensure_quantized,
    quantized_model_path,
)
from neuronpack.progress import NullReporter, Reporter


@dataclass
class CompileResult:
    path: Path
    key: str
    cache_hit: bool
    framework: str
    framework_reason: str
    manifest: dict[str, Any] | None = None  # None for --dry-run
    compile_config: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    dry_run: bool = False


def _key_for(inputs: ResolvedInputs) -> tuple[str, dict[str, Any]]:
    extra: dict[str, Path] = {}
    if inputs.draft_dir is not None:
        extra["draft"] = inputs.draft_dir
    ki = key_inputs(
        framework=inputs.framework,
        versions=toolchain_versions(inputs.backend),
        target=inputs.backend.target(inputs.recipe),
        recipe=inputs.recipe,
        plan=inputs.plan,
        model_dir=inputs.model_dir,
        extra_models=extra,
    )
    if inputs.recipe.lora:
        ki["lora"] = {
            a.name: directory_identity(Path(a.path)) if Path(a.path).is_dir() else a.path
            for a in inputs.recipe.lora.adapters
        }
    return compute_key(ki), ki


def _serve_hints(inputs: ResolvedInputs, model_dir: Path, draft_dir: Path | None) -> dict[str, Any]:
    r = inputs.recipe
    spec_len = r.speculation.length if r.speculation else 0
    return {
        "served_model_name": r.name or Path(str(r.model.source).rstrip("/")).name,
        "model_source": r.model.source,
        "model_path": str(model_dir),
        "max_model_len": r.target.seq_len,
        "max_num_seqs": r.target.batch_size,
        "tensor_parallel_size": r.target.tp_degree,
        "nodes": r.target.nodes,
        "speculation_length": spec_len,
        "num_lookahead_slots": spec_len,
        "draft_path": str(draft_dir) if draft_dir else None,
        "lora_modules": [a.model_dump() for a in r.lora.adapters] if r.lora else [],
    }


def _request(inputs: ResolvedInputs, model_dir: Path, draft_dir: Path | None, staging: Path, reporter: Reporter):
    return BuildRequest(model_dir=model_dir, recipe=inputs.recipe, plan=inputs.plan, staging=staging,
                        reporter=reporter, draft_dir=draft_dir, source_model_dir=inputs.model_dir)


def _prequantize(inputs: ResolvedInputs) -> bool:
    """Offline quantization runs unless the framework quantizes at load time itself (transformers-neuronx)."""
    return inputs.recipe.quantization is not None and not inputs.backend.quantizes_on_load


def compile_model(
    model: str | None,
    *,
    recipe: Path | None = None,
    overrides: Sequence[str] = (),
    framework: str | None = None,
    out_root: Path | None = None,
    dest: Path | None = None,
    force: bool = False,
    dry_run: bool = False,
    reporter: Reporter | None = None,
) -> CompileResult:
    """Compile MODEL with a recipe into ``<root>/neuron-compiled-artifacts/<key>/`` (or exactly ``dest``), or return
    the existing artifact for the same key. Raises NeuronpackError subclasses on bad input or a failed build."""
    reporter = reporter or NullReporter()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    inputs = resolve_inputs(model, recipe_path=recipe, overrides=overrides, framework=framework, reporter=reporter)
    reporter.info(f"framework: {inputs.framework} ({inputs.framework_reason})")
    timings["resolve"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    key, ki = _key_for(inputs)
    timings["key"] = time.perf_counter() - t0
    store = artifacts_root(out_root)
    final = Path(dest).expanduser().absolute() if dest is not None else store / key
    cache_root = store.parent if dest is None else final.parent

    if dry_run:
        model_dir = inputs.model_dir
        if _prequantize(inputs):
            model_dir = quantized_model_path(cache_root, inputs.model_dir, inputs.recipe.quantization)
        draft = inputs.draft_dir
        if draft is not None and inputs.recipe.speculation.kind == "eagle":
            draft = converted_draft_path(cache_root, draft, inputs.model_dir)
        config = inputs.backend.compile_config(_request(inputs, model_dir, draft, final, reporter))
        return CompileResult(final, key, False, inputs.framework, inputs.framework_reason, None, config, timings,
                             dry_run=True)

    if not force and (manifest := quick_check(final, key)) is not None:
        return _hit(final, key, inputs, timings, manifest)

    availability = inputs.backend.availability()
    if not availability.ok:
        raise BackendUnavailableError(
            f"framework {inputs.framework} cannot build here: {availability.reason}",
            fix="run on a machine with the Neuron SDK, use --framework torch, or --dry-run to see the configuration",
        )
    with key_lock(final.parent / ".locks", final.name,
                  on_wait=lambda: reporter.info("another build of this key is running; waiting for it")):
        if not force and (manifest := quick_check(final, key)) is not None:
            return _hit(final, key, inputs, timings, manifest)
        return _build(inputs, key, ki, final, cache_root, timings, reporter, replace=final.exists())


def _hit(final: Path, key: str, inputs: ResolvedInputs, timings: dict[str, float],
         manifest: dict[str, Any]) -> CompileResult:
    return CompileResult(final, key, True, inputs.framework, inputs.framework_reason, manifest,
                         manifest.get("compile_config", {}), timings)


def _build(inputs: ResolvedInputs, key: str, ki: dict[str, Any], final: Path, cache_root: Path,
           timings: dict[str, float], reporter: Reporter, *, replace: bool) -> CompileResult:
    staging = new_staging(final.parent, key)
    try:
        model_dir = inputs.model_dir
        if _prequantize(inputs):
            t0 = time.perf_counter()
            model_dir = ensure_quantized(cache_root, inputs.model_dir, inputs.recipe.quantization, reporter)
            timings["quantize"] = time.perf_counter() - t0
        draft_dir = inputs.draft_dir
        if draft_dir is not None and inputs.recipe.speculation.kind == "eagle":
            draft_dir = ensure_eagle_draft(cache_root, draft_dir, inputs.model_dir, reporter)
        request = _request(inputs, model_dir, draft_dir, staging, reporter)
        config = inputs.backend.compile_config(request)
        t0 = time.perf_counter()
        extras = inputs.backend.build(request) or {}
        timings["build"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        manifest = build_manifest(
            key=key,
            key_inputs=ki,
            recipe=inputs.recipe.to_dict(),
            model={"source": inputs.recipe.model.source, "path": str(model_dir),
                   "original_path": str(inputs.model_dir), "config": ki["model"]["config"]},
            compile_config=config,
            serve=_serve_hints(inputs, model_dir, draft_dir),
            timings=timings,
            extras={**extras, "framework_reason": inputs.framework_reason},
            root=staging,
        )
        timings["manifest"] = time.perf_counter() - t0
        manifest["timings"] = {k: round(v, 3) for k, v in timings.items()}
        write_manifest(staging, manifest)  # last: only now can the directory load as valid
        publish(staging, final, replace=replace, read_only=inputs.backend.name in NEURON_FRAMEWORKS)
    except NeuronpackError as exc:
        remove_tree(staging)
        record_failure(final.parent, key, exc.one_line(), traceback.format_exc())
        raise
    except BaseException as exc:
        remove_tree(staging)
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        log = record_failure(final.parent, key, repr(exc), traceback.format_exc())
        raise BuildError(f"{inputs.framework} build failed: {type(exc).__name__}: {exc}", where=str(log),
                         fix="read the log; rerun with NEURONPACK_DEBUG=1 for a traceback") from exc
    return CompileResult(final, key, False, inputs.framework, inputs.framework_reason, manifest, config, timings)
