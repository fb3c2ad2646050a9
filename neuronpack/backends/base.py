"""The small protocol every compile backend implements, and the request the pipeline hands it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from neuronpack.progress import NullReporter, Reporter

if TYPE_CHECKING:
    from neuronpack.artifacts.manifest import Manifest
    from neuronpack.buckets import BucketPlan
    from neuronpack.recipe import Recipe


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str


@dataclass(frozen=True)
class BuildRequest:
    model_dir: Path  # resolved local HF checkpoint (already quantized when the recipe asks for it)
    recipe: Recipe
    plan: BucketPlan
    staging: Path  # empty directory: the backend writes every artifact file here except neuronpack.json
    reporter: Reporter = field(default_factory=NullReporter)
    draft_dir: Path | None = None  # resolved speculation draft (converted EAGLE draft for kind "eagle")
    source_model_dir: Path | None = None  # the checkpoint as given, before offline quantization
    lora_dirs: Mapping[str, Path] = field(default_factory=dict)  # adapter name -> resolved local directory

    def adapter_dirs(self) -> dict[str, Path]:
        """Every recipe adapter's local directory (resolved by the pipeline; the recipe's path when not given)."""
        lora = self.recipe.lora
        if lora is None:
            return {}
        return {a.name: Path(self.lora_dirs.get(a.name) or Path(a.path).expanduser()) for a in lora.adapters}


class Backend(Protocol):
    name: str  # "torch" | "nxd" | "tnx"
    # True when the framework quantizes at load time and must be given the unquantized checkpoint (TNx); the
    # pipeline then skips offline quantization and the recipe's [quantization] only configures the backend.
    quantizes_on_load: bool

    def availability(self) -> Availability:
        """Whether this backend can build here, and why not."""
        ...

    def versions(self) -> dict[str, str]:
        """Toolchain versions that go into the key and manifest (no heavy imports)."""
        ...

    def target(self, recipe: Recipe) -> dict[str, Any]:
        """What the compiled code is specific to (instance, device, CPU capability, compiler settings); torch-free."""
        ...

    def compile_config(self, request: BuildRequest) -> dict[str, Any]:
        """The configuration handed to the compiler (shown by --dry-run, part of the key)."""
        ...

    def build(self, request: BuildRequest) -> dict[str, Any]:
        """Compile into request.staging; return extra manifest information (e.g. per-bucket seconds)."""
        ...

    def validate_artifact(self, artifact_dir: Path, manifest: Manifest) -> None:
        """Raise ArtifactError when the artifact cannot be loaded on this machine (missing file, mismatch)."""
        ...
