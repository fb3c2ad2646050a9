"""The build plan: everything a compile works out before it builds, shared by ``--dry-run`` and the build.

Example::

    plan = plan_build(resolve_inputs(...), out_root=None, dest=None)
    plan.key, plan.dest              # the content key and <root>/neuron-compiled-artifacts/<key>
    plan.compile_config(reporter)    # what --dry-run prints and the build hands the backend
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.artifacts.key import compute_key, key_inputs, toolchain_versions
from neuronpack.artifacts.store import artifacts_root
from neuronpack.backends.base import BuildRequest, GraphDonor
from neuronpack.pipeline.inputs import ResolvedInputs
from neuronpack.progress import Reporter
from neuronpack.recipe_memo import full_recipe

if TYPE_CHECKING:
    from neuronpack.artifacts.manifest import ModelInfo, ServeHints


@dataclass(frozen=True)
class BuildPlan:
    inputs: ResolvedInputs
    key: str
    key_inputs: dict[str, Any]  # recorded in full in the manifest
    dest: Path  # the artifact directory this build publishes
    cache_root: Path  # derived checkpoints (quantized, converted drafts) are cached below it
    model_dir: Path  # the checkpoint the backend reads: the quantized copy when the pipeline quantizes offline
    draft_dir: Path | None  # the draft the backend reads: the converted copy for EAGLE drafts
    prequantize: bool  # offline quantization into model_dir runs before the build
    convert_draft: bool  # EAGLE conversion into draft_dir runs before the build

    @cached_property
    def graph_key_inputs(self) -> dict[str, Any]:
        """The graph key's inputs (artifacts/graph_key.py): worked out on a miss only, never for a cache hit."""
        from neuronpack.artifacts.graph_key import code_digest, graph_key_inputs

        i = self.inputs
        adapters = {a.name: Path(i.lora_dirs.get(a.name) or a.path) for a in i.recipe.lora.adapters} if i.recipe.lora \
            else {}
        return graph_key_inputs(self.key_inputs, code=code_digest(i.framework), lora_dirs=adapters,
                                ignore=i.backend.graph_key_ignores)

    @property
    def graph_key(self) -> str:
        from neuronpack.artifacts.graph_key import compute_graph_key

        return compute_graph_key(self.graph_key_inputs)

    def for_build(self) -> BuildPlan:
        """This plan with the recipe fully validated (``recipe_memo.full_recipe``): what a build or --dry-run runs
        on. Keying and the cache-hit check work on the memo's view alone."""
        recipe = full_recipe(self.inputs.recipe)
        return self if recipe is self.inputs.recipe else replace(self, inputs=replace(self.inputs, recipe=recipe))

    def request(self, staging: Path, reporter: Reporter, donor: GraphDonor | None = None) -> BuildRequest:
        i = self.inputs
        return BuildRequest(model_dir=self.model_dir, recipe=i.recipe, plan=i.plan, staging=staging,
                            reporter=reporter, draft_dir=self.draft_dir, source_model_dir=i.model_dir,
                            lora_dirs=i.lora_dirs, donor=donor)

    def compile_config(self, reporter: Reporter) -> dict[str, Any]:
        """The configuration the backend compiles with (the same for --dry-run and the build)."""
        return self.inputs.backend.compile_config(self.request(self.dest, reporter))

    def model_info(self) -> ModelInfo:
        from neuronpack.artifacts.manifest import ModelInfo

        return ModelInfo(source=self.inputs.recipe.model.source, path=str(self.model_dir),
                         original_path=str(self.inputs.model_dir), config=self.key_inputs["model"]["config"])

    def serve_hints(self) -> ServeHints:
        from neuronpack.artifacts.manifest import LoraModule, ServeHints

        r = self.inputs.recipe
        spec_len = r.speculation.length if r.speculation else 0
        return ServeHints(
            served_model_name=r.name or Path(str(r.model.source).rstrip("/")).name,
            model_source=r.model.source,
            model_path=str(self.model_dir),
            max_model_len=r.target.seq_len,
            max_num_seqs=r.target.batch_size,
            tensor_parallel_size=r.target.tp_degree,
            nodes=r.target.nodes,
            speculation_length=spec_len,
            num_lookahead_slots=spec_len,
            draft_path=str(self.draft_dir) if self.draft_dir else None,
            lora_modules=tuple(LoraModule(name=a.name, path=a.path) for a in r.lora.adapters) if r.lora else (),
        )


def plan_build(inputs: ResolvedInputs, *, out_root: Path | None, dest: Path | None) -> BuildPlan:
    """Key the inputs and decide every path the build reads and writes (nothing is written here)."""
    ki = key_inputs(
        framework=inputs.framework,
        versions=toolchain_versions(inputs.backend),
        target=inputs.backend.target(inputs.recipe),
        recipe=inputs.recipe,
        plan=inputs.plan,
        model_dir=inputs.model_dir,
        draft_dir=inputs.draft_dir,
        lora_dirs=inputs.lora_dirs,
    )
    key = compute_key(ki)
    store = artifacts_root(out_root)
    final = Path(dest).expanduser().absolute() if dest is not None else store / key
    cache_root = store.parent if dest is None else final.parent
    # Offline quantization runs unless the framework quantizes at load time itself (transformers-neuronx).
    prequantize = inputs.recipe.quantization is not None and not inputs.backend.quantizes_on_load
    model_dir = inputs.model_dir
    if prequantize:
        from neuronpack.pipeline.prepare import quantized_model_path  # imports convert/: only when it quantizes

        model_dir = quantized_model_path(cache_root, inputs.model_dir, inputs.recipe.quantization)
    convert_draft = inputs.draft_dir is not None and inputs.recipe.speculation.kind == "eagle"
    draft_dir = inputs.draft_dir
    if convert_draft:
        from neuronpack.pipeline.prepare import converted_draft_path

        draft_dir = converted_draft_path(cache_root, inputs.draft_dir, inputs.model_dir)
    return BuildPlan(inputs=inputs, key=key, key_inputs=ki, dest=final, cache_root=cache_root, model_dir=model_dir,
                     draft_dir=draft_dir, prequantize=prequantize, convert_draft=convert_draft)
