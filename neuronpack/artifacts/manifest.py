"""The manifest ``neuronpack.json``: written last into a staging directory, it is what makes an artifact valid.

It records every key input in full, the resolved recipe, versions, target, buckets, the file list with sizes and
sha256, stage timings, and the hints ``serve`` needs to start vLLM or the portable runtime with matching arguments.

``read_manifest`` returns a typed, frozen ``Manifest``: every reader (verify, the runtime loader, the vLLM launch
line, inspect, ls) gets the same field names and defaults from here. The JSON on disk is unchanged: ``to_json()`` of a
manifest read from disk gives back the same object, and ``key_inputs`` is kept verbatim (the key is its hash).

Example::

    manifest = read_manifest(Path("neuron-compiled-artifacts/3f2a..."))
    manifest.framework                  # "torch"
    manifest.serve.max_model_len        # 1024
    manifest.recipe.sampling.global_topk
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from neuronpack import __version__
from neuronpack.artifacts.manifest_json import (
    MANIFEST_NAME,
    MANIFEST_SCHEMA,
    REBUILD,
    REQUIRED_FIELDS,
    check_manifest_shape,
    read_manifest_json,
)
from neuronpack.buckets import BucketPlan
from neuronpack.digest import sha256_stream
from neuronpack.errors import ArtifactError
from neuronpack.fsutil import write_text_atomic
from neuronpack.recipe import Recipe

__all__ = ["MANIFEST_NAME", "MANIFEST_SCHEMA", "REBUILD", "REQUIRED_FIELDS", "Manifest", "read_manifest"]


class _Frozen(BaseModel):
    # extra="allow": fields written by a newer neuronpack survive a read and a re-dump
    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)


class FileEntry(_Frozen):
    path: str  # relative, POSIX separators
    size: int
    sha256: str


class ModelInfo(_Frozen):
    source: str | None = None  # what the user passed (a directory or hub id)
    path: str | None = None  # the checkpoint the build read (the quantized copy when the recipe quantizes)
    original_path: str | None = None  # the checkpoint as given
    config: dict[str, Any] = {}  # config.json minus cosmetic keys


class LoraModule(_Frozen):
    name: str
    path: str


class ServeHints(_Frozen):
    """What a server needs to load the artifact without recompiling (vLLM flags; the portable runtime's limits)."""

    served_model_name: str | None = None
    model_source: str | None = None
    model_path: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    tensor_parallel_size: int | None = None
    nodes: int = 1
    speculation_length: int = 0
    num_lookahead_slots: int = 0
    draft_path: str | None = None
    lora_modules: tuple[LoraModule, ...] = ()


class Manifest(_Frozen):
    schema_version: int = Field(alias="schema")
    neuronpack_version: str | None = None
    key: str
    key_inputs: dict[str, Any]  # verbatim: the key is sha256 of its canonical JSON
    framework: str
    versions: dict[str, str]
    target: dict[str, Any]
    buckets: BucketPlan
    recipe: Recipe
    model: ModelInfo = ModelInfo()
    compile_config: dict[str, Any] = {}
    serve: ServeHints = ServeHints()
    build: dict[str, Any] = {}  # what the backend reported (per-bucket seconds, framework_reason, ...)
    timings: dict[str, float] = {}
    files: tuple[FileEntry, ...]
    created_at: str | None = None
    created_by: dict[str, Any] = {}
    # `compile --check-accuracy` figures (neuronpack.accuracy's report): results, not key inputs; None = not checked
    accuracy: dict[str, Any] | None = None
    # the graph key (artifacts/graph_key.py) and where the compiled graphs came from: {"key", "code", "seconds" (the
    # compile they cost where first built), "from" (the donor: key, source, files, bytes; None when built here)};
    # None for artifacts built before graph keys
    graphs: dict[str, Any] | None = None

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        """The manifest as it is written to disk (JSON types, the on-disk key names)."""
        # unchecked builds (and artifacts from before graph keys) keep the older JSON shape
        absent = {name for name in ("accuracy", "graphs") if getattr(self, name) is None}
        return self.model_dump(mode="json", by_alias=True, exclude=absent or None)

    def with_serve(self, **hints: Any) -> Manifest:
        """A copy with some serve hints replaced (e.g. ``served_model_name`` from the command line)."""
        return self.model_copy(update={"serve": self.serve.model_copy(update=hints)})


def file_entries(root: Path) -> list[FileEntry]:
    """Every file below root except the manifest, sorted by path."""
    entries = []
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel == MANIFEST_NAME:
            continue
        entries.append(FileEntry(path=rel, size=path.stat().st_size, sha256=sha256_stream(path)))
    return entries


def build_manifest(
    *,
    key: str,
    key_inputs: dict[str, Any],
    recipe: Recipe,
    plan: BucketPlan,
    model: ModelInfo,
    compile_config: dict[str, Any],
    serve: ServeHints,
    timings: dict[str, float],
    extras: dict[str, Any],
    root: Path,
    graphs: dict[str, Any] | None = None,
) -> Manifest:
    return Manifest(
        schema_version=MANIFEST_SCHEMA,
        neuronpack_version=__version__,
        key=key,
        key_inputs=key_inputs,
        framework=key_inputs["framework"],
        versions=key_inputs["versions"],
        target=key_inputs["target"],
        buckets=plan,
        recipe=recipe,
        model=model,
        compile_config=compile_config,
        serve=serve,
        build=extras,
        timings={k: round(v, 3) for k, v in timings.items()},
        files=tuple(file_entries(root)),
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        created_by={"host": os.uname().nodename, "pid": os.getpid()},
        graphs=graphs,
    )


def write_manifest(root: Path, manifest: Manifest) -> Path:
    path = Path(root) / MANIFEST_NAME
    write_text_atomic(path, json.dumps(manifest.to_json(), indent=2, sort_keys=True) + "\n")
    return path


def read_manifest(artifact_dir: Path) -> Manifest:
    """The manifest of an artifact directory; ArtifactError when the directory or manifest is missing or invalid."""
    return parse_manifest(read_manifest_json(artifact_dir), where=str(Path(artifact_dir) / MANIFEST_NAME))


def parse_manifest(data: Any, *, where: str) -> Manifest:
    """A Manifest from its JSON object; ArtifactError naming the first problem."""
    check_manifest_shape(data, where=where)
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ArtifactError(f"{MANIFEST_NAME} field {loc}: {err['msg']}", where=where, fix=REBUILD) from None
