"""`neuronpack verify` as a library call: an artifact's contents (artifacts/verify.py) and that this machine's
toolchain is the one its framework's backend was built with."""

from __future__ import annotations

from pathlib import Path

from neuronpack.artifacts.manifest import Manifest
from neuronpack.artifacts.verify import check_toolchain, verify_contents


def verify_artifact(artifact_dir: Path, *, check_hashes: bool = True, check_env: bool = True) -> Manifest:
    """Full verification: schema, key, every file's size and sha256, and (check_env) that this machine's toolchain
    matches. Returns the manifest; raises ArtifactError naming the first problem.

    Example: ``verify_artifact(Path("neuron-compiled-artifacts/3f2a...")).key``
    """
    manifest = verify_contents(artifact_dir, check_hashes=check_hashes)
    if check_env:
        from neuronpack.backends.select import get_backend

        check_toolchain(artifact_dir, manifest, get_backend(manifest.framework))
    return manifest
