"""Whether a portable artifact can load here, checked before anything heavy is read (torch-free): its files, and
the torch / CPU / device its graphs were built for (``ArtifactConfig.target``).

Example::

    check_loadable(artifact_dir, read_artifact_config(artifact_dir).target)   # ArtifactError naming what differs
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from neuronpack.backends.torch_aot.layout import GRAPHS_FILE, NEURON_CONFIG, WEIGHTS_DIR
from neuronpack.backends.torch_aot.target import current_target, target_mismatch
from neuronpack.errors import ArtifactError

REQUIRED_FILES = (NEURON_CONFIG, GRAPHS_FILE, "config.json", f"{WEIGHTS_DIR}/config.json")
REBUILD = "recompile it (neuronpack compile --force)"


def check_loadable(artifact_dir: Path, built_target: Mapping[str, Any]) -> None:
    """Raise ArtifactError if a file is missing or the artifact was built for another torch / CPU / device."""
    artifact_dir = Path(artifact_dir)
    for name in REQUIRED_FILES:
        if not (artifact_dir / name).is_file():
            raise ArtifactError(f"artifact is missing {name}", where=str(artifact_dir), fix=REBUILD)
    if not any((artifact_dir / WEIGHTS_DIR).glob("*.safetensors")):
        raise ArtifactError("artifact has no weights", where=str(artifact_dir / WEIGHTS_DIR), fix=REBUILD)
    here = current_target(built_target.get("compiler", "aoti"), built_target.get("device", "cpu"))
    problem = target_mismatch(dict(built_target), here)
    if problem:
        raise ArtifactError(problem, where=str(artifact_dir),
                            fix="rebuild with neuronpack compile on this machine, or use compiler=export")


def check_device(artifact_dir: Path, built_target: Mapping[str, Any], device: str | None) -> None:
    """Refuse loading on ``device`` (None: the one it was built for) an artifact built for another."""
    if device is not None and device != built_target.get("device"):
        raise ArtifactError(f"built for device {built_target.get('device')}, asked to load on {device}",
                            where=str(artifact_dir), fix=f"recompile with target.instance = {device!r}")
