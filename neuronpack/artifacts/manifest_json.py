"""The manifest file ``neuronpack.json`` as plain JSON: reading it, its shape (schema, required fields) and the
stat-only completeness check of a cache hit, without pydantic (``artifacts.manifest`` types it on top of this).

Example::

    data = complete_manifest_json(Path("neuron-compiled-artifacts/3f2a..."), key="3f2a...")
    data is None or data["key"] == "3f2a..."     # None: not a complete artifact of that key
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from neuronpack.artifacts.paths import member_path
from neuronpack.errors import ArtifactError

MANIFEST_NAME = "neuronpack.json"
MANIFEST_SCHEMA = 1
REQUIRED_FIELDS = ("schema", "key", "key_inputs", "framework", "versions", "target", "recipe", "buckets", "files")
REBUILD = "rebuild it with `neuronpack compile --force`"


def read_manifest_json(artifact_dir: Path) -> dict[str, Any]:
    """The manifest of an artifact directory as a JSON object of the current schema with every required field;
    ArtifactError when the directory or manifest is missing or malformed. Field types are not checked here."""
    artifact_dir = Path(artifact_dir)
    if not artifact_dir.is_dir():
        raise ArtifactError("artifact directory does not exist", where=str(artifact_dir),
                            fix="run `neuronpack compile` or check the path")
    path = artifact_dir / MANIFEST_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"no {MANIFEST_NAME}: not a neuronpack artifact or an unfinished build",
                            where=str(artifact_dir), fix="rebuild it with `neuronpack compile`") from None
    except ValueError as exc:
        raise ArtifactError(f"{MANIFEST_NAME} is not valid JSON ({exc})", where=str(path), fix=REBUILD) from None
    check_manifest_shape(data, where=str(path))
    return data


def check_manifest_shape(data: Any, *, where: str) -> None:
    """A JSON object of this manifest schema with every required field; ArtifactError naming the first problem."""
    if not isinstance(data, dict):
        raise ArtifactError(f"{MANIFEST_NAME} is not a JSON object", where=where, fix="rebuild the artifact")
    missing = [f for f in REQUIRED_FIELDS if f not in data]
    if missing:
        raise ArtifactError(f"{MANIFEST_NAME} lacks {', '.join(missing)}", where=where, fix=REBUILD)
    if data["schema"] != MANIFEST_SCHEMA:
        raise ArtifactError(f"manifest schema {data['schema']} is not {MANIFEST_SCHEMA}", where=where,
                            fix="rebuild it with this neuronpack version")


def complete_manifest_json(artifact_dir: Path, key: str | None = None) -> dict[str, Any] | None:
    """The manifest (JSON) if the directory is a complete artifact (of ``key`` when given): the manifest reads, and
    every listed file is inside the artifact with its recorded size. Else None. Stats files only."""
    try:
        data = read_manifest_json(artifact_dir)
    except ArtifactError:
        return None
    if key is not None and data["key"] != key:
        return None
    if not isinstance(data["files"], list):
        return None
    for entry in data["files"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) or type(entry.get("size")) is not int:
            return None
        try:
            path = member_path(artifact_dir, entry["path"])
        except ArtifactError:
            return None
        if not path.is_file() or path.stat().st_size != entry["size"]:
            return None
    return data
