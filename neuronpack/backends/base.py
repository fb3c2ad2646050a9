"""The small protocol every compile backend implements, and the request the pipeline hands it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
class GraphDonor:
    """A published artifact of the same graph key whose compiled graphs this build takes instead of compiling: its
    graph files (``Backend.graph_files``) are already in the staging directory, checked against its manifest."""

    key: str  # the donor artifact's key
    files: tuple[str, ...]  # the graph files it gave (relative paths, now in staging)


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
    donor: GraphDonor | None = None  # compiled graphs taken from an artifact of the same graph key: compile nothing

    def adapter_dirs(self) -> dict[str, Path]:
        """Every recipe adapter's local directory (resolved by the pipeline; the recipe's path when not given)."""
        lora = self.recipe.lora
        if lora is None:
            return {}
        return {a.name: Path(self.lora_dirs.get(a.name) or Path(a.path).expanduser()) for a in lora.adapters}


class Backend(Protocol):
    name: str  # "torch" | "nxd" | "tnx" | "vneuron"
    # True when the framework quantizes at load time and must be given the unquantized checkpoint (TNx); the
    # pipeline then skips offline quantization and the recipe's [quantization] only configures the backend.
    quantizes_on_load: bool
    # compile --check-accuracy runs before the build (NxDI's CPU run, before neuronx-cc) instead of on the artifact.
    checks_accuracy_before_compile: bool
    # Dotted paths of the key's compile inputs that only serving reads: left out of the graph key (graph_key.py).
    graph_key_ignores: tuple[str, ...]

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
        """Compile into request.staging; return extra manifest information (e.g. per-bucket seconds). With
        ``request.donor`` the graphs are already there: write only what depends on the weights' values."""
        ...

    def graph_files(self, paths: Sequence[str]) -> list[str]:
        """Which of an artifact's files (relative paths) are its compiled graphs: what a donor gives another build
        of the same graph key. Everything else is made again from the new checkpoint."""
        ...

    def graph_reuse_problem(self) -> str | None:
        """Why this backend cannot take a donor's graphs here (None: it can)."""
        ...

    def validate_artifact(self, artifact_dir: Path, manifest: Manifest) -> None:
        """Raise ArtifactError when the artifact cannot be loaded on this machine (missing file, mismatch)."""
        ...
