"""TEST STAND-IN for vllm_neuron/compile/schema.py, the one module of the plugin's cache path missing from
../shared/upstream/vllm-neuron-0.21 (PROVENANCE.md: not found in the index).

What upstream's cache.py needs of it: ``ArtifactMetadata`` with ``version`` (the ``.artifact_metadata_v<N>.json``
name), ``cache_key`` (checked against the entry's directory by ``_build_cache_artifact``) and pydantic's
``model_dump_json``; ``create_metadata(**fields)`` (capture_backend.py's call) and ``parse_metadata_dict`` (cache.py's
``_load_artifact_metadata``, which catches ValueError). The fields are the ones capture_backend.py passes.

This directory is a namespace-package portion (no __init__.py): Python merges it with upstream's ``vllm_neuron``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class ArtifactMetadata(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = 0
    cache_key: str
    output_count: int | None = None
    unused_input_indices: list[int] = []
    has_rng_seed_parameter: bool = False
    io_map: dict[str, Any] | None = None


def create_metadata(**fields: Any) -> ArtifactMetadata:
    return ArtifactMetadata(**fields)


def parse_metadata_dict(data: dict[str, Any]) -> ArtifactMetadata:
    return ArtifactMetadata.model_validate(data)  # pydantic's ValidationError is a ValueError
