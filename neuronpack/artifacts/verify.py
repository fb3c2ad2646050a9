"""Is an artifact directory valid? A cheap check for cache hits and the content checks of `neuronpack verify`.

"Invalid" is what vLLM would treat as FileNotFoundError / ValueError at load: a missing directory or manifest, a
manifest that does not match its key, a missing, resized or (full check) modified file, or a toolchain mismatch.
Which backend judges the toolchain is the caller's business (``pipeline.verify_artifact`` picks it from the
manifest's framework), so this module never reaches into backends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from neuronpack.artifacts.key import compute_key, toolchain_versions
from neuronpack.artifacts.manifest import MANIFEST_NAME, REBUILD, Manifest, parse_manifest, read_manifest
from neuronpack.artifacts.manifest_json import complete_manifest_json
from neuronpack.artifacts.paths import check_no_symlinks, member_path
from neuronpack.digest import sha256_stream
from neuronpack.errors import ArtifactError


class ToolchainJudge(Protocol):
    """What check_toolchain needs of a backend."""

    def versions(self) -> dict[str, str]: ...

    def validate_artifact(self, artifact_dir: Path, manifest: Manifest) -> None: ...


def quick_check(artifact_dir: Path, key: str | None = None) -> Manifest | None:
    """The manifest if the directory is a complete artifact (of ``key`` when given), else None. Stats files only."""
    data = complete_manifest_json(artifact_dir, key)
    if data is None:
        return None
    try:
        return parse_manifest(data, where=str(Path(artifact_dir) / MANIFEST_NAME))
    except ArtifactError:
        return None


def check_files(artifact_dir: Path, manifest: Manifest, *, check_hashes: bool = True) -> None:
    """Every listed file inside the artifact (paths.member_path), present with its size and sha256; no symlinks and
    no unlisted files. Raises on the first problem."""
    root = Path(artifact_dir)
    check_no_symlinks(root)
    listed = set()
    for entry in manifest.files:
        rel = entry.path
        listed.add(rel)
        path = member_path(root, rel)
        if not path.is_file():
            raise ArtifactError(f"file {rel} is missing", where=str(root), fix=REBUILD)
        size = path.stat().st_size
        if size != entry.size:
            raise ArtifactError(f"file {rel} has {size} bytes, the manifest says {entry.size} (truncated or "
                                "replaced)", where=str(root), fix=REBUILD)
        if check_hashes and sha256_stream(path) != entry.sha256:
            raise ArtifactError(f"file {rel} does not match its sha256 (corrupted or modified)", where=str(root),
                                fix=REBUILD)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel != MANIFEST_NAME and rel not in listed:
            raise ArtifactError(f"file {rel} is not in the manifest (added after the build)", where=str(root),
                                fix="remove it or rebuild the artifact")


def check_key(artifact_dir: Path, manifest: Manifest) -> None:
    """The manifest's key must be the hash of its recorded inputs (catches edited manifests)."""
    if compute_key(manifest.key_inputs) != manifest.key:
        raise ArtifactError(
            "the manifest's key does not match its recorded inputs (the manifest was edited)",
            where=str(Path(artifact_dir) / MANIFEST_NAME),
            fix=REBUILD,
        )


def check_toolchain(artifact_dir: Path, manifest: Manifest, backend: ToolchainJudge) -> None:
    """The toolchain here must be the one the artifact was built with; the backend checks its own target."""
    current = toolchain_versions(backend)
    for name, built in sorted(manifest.versions.items()):
        here = current.get(name)
        if here != built:
            raise ArtifactError(
                f"built with {name} {built}, this machine has {here if here not in (None, 'absent') else 'none'}",
                where=str(artifact_dir),
                fix=f"install {name}=={built} or rebuild with `neuronpack compile`",
            )
    backend.validate_artifact(Path(artifact_dir), manifest)


def verify_contents(artifact_dir: Path, *, check_hashes: bool = True) -> Manifest:
    """Schema, key, every file's size and (with check_hashes) sha256. Returns the manifest; ArtifactError naming
    the first problem. ``pipeline.verify_artifact`` adds the toolchain check."""
    manifest = read_manifest(artifact_dir)
    check_key(artifact_dir, manifest)
    check_files(artifact_dir, manifest, check_hashes=check_hashes)
    return manifest
