"""The manifest ``neuronpack.json``: written last into a staging directory, it is what makes an artifact valid.

It records every key input in full, the resolved recipe, versions, target, buckets, the file list with sizes and
sha256, stage timings, and the hints ``serve`` needs to start vLLM or the portable runtime with matching arguments.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from neuronpack import __version__
from neuronpack.digest import sha256_stream
from neuronpack.errors import ArtifactError
from neuronpack.fsutil import write_text_atomic

MANIFEST_NAME = "neuronpack.json"
MANIFEST_SCHEMA = 1
REQUIRED_FIELDS = ("schema", "key", "key_inputs", "framework", "versions", "target", "recipe", "buckets", "files")


def file_entries(root: Path) -> list[dict[str, Any]]:
    """[{path, size, sha256}] for every file below root except the manifest, sorted by path."""
    entries = []
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel == MANIFEST_NAME:
            continue
        entries.append({"path": rel, "size": path.stat().st_size, "sha256": sha256_stream(path)})
    return entries


def build_manifest(
    *,
    key: str,
    key_inputs: dict[str, Any],
    recipe: dict[str, Any],
    model: dict[str, Any],
    compile_config: dict[str, Any],
    serve: dict[str, Any],
    timings: dict[str, float],
    extras: dict[str, Any],
    root: Path,
) -> dict[str, Any]:
    return {
        "schema": MANIFEST_SCHEMA,
        "neuronpack_version": __version__,
        "key": key,
        "key_inputs": key_inputs,
        "framework": key_inputs["framework"],
        "versions": key_inputs["versions"],
        "target": key_inputs["target"],
        "buckets": key_inputs["compile"]["buckets"],
        "recipe": recipe,
        "model": model,
        "compile_config": compile_config,
        "serve": serve,
        "build": extras,
        "timings": {k: round(v, 3) for k, v in timings.items()},
        "files": file_entries(root),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "created_by": {"host": os.uname().nodename, "pid": os.getpid()},
    }


def write_manifest(root: Path, manifest: dict[str, Any]) -> Path:
    path = Path(root) / MANIFEST_NAME
    write_text_atomic(path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return path


def read_manifest(artifact_dir: Path) -> dict[str, Any]:
    """The manifest of an artifact directory; ArtifactError when the directory or manifest is missing or invalid."""
    artifact_dir = Path(artifact_dir)
    if not artifact_dir.is_dir():
        raise ArtifactError("artifact directory does not exist", where=str(artifact_dir),
                            fix="run `neuronpack compile` or check the path")
    path = artifact_dir / MANIFEST_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ArtifactError(f"no {MANIFEST_NAME}: not a neuronpack artifact or an unfinished build",
                            where=str(artifact_dir), fix="rebuild it with `neuronpack compile`") from None
    return parse_manifest(text, where=str(path))


def parse_manifest(text: str | bytes, *, where: str) -> dict[str, Any]:
    """A manifest from its JSON text (a local file or a remote object named by ``where``), schema checked."""
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise ArtifactError(f"{MANIFEST_NAME} is not valid JSON ({exc})", where=where,
                            fix="rebuild it with `neuronpack compile --force`") from None
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{MANIFEST_NAME} is not a JSON object", where=where, fix="rebuild the artifact")
    missing = [f for f in REQUIRED_FIELDS if f not in manifest]
    if missing:
        raise ArtifactError(f"{MANIFEST_NAME} lacks {', '.join(missing)}", where=where,
                            fix="rebuild it with `neuronpack compile --force`")
    if manifest["schema"] != MANIFEST_SCHEMA:
        raise ArtifactError(f"manifest schema {manifest['schema']} is not {MANIFEST_SCHEMA}", where=where,
                            fix="rebuild it with this neuronpack version")
    return manifest
