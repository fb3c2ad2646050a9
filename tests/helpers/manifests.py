"""Manifests made in a test: the fields a test cares about, placeholders for the rest (validated like a real one)."""

from __future__ import annotations

from typing import Any

from neuronpack.artifacts.manifest import MANIFEST_SCHEMA, Manifest

PLACEHOLDER_BUCKETS = {"context": [128], "token_generation": [128], "max_context_length": 128, "seq_len": 128}


def make_manifest(**fields: Any) -> Manifest:
    """``make_manifest(framework="nxd", versions={...})``: any manifest field as its JSON value."""
    base: dict[str, Any] = {"schema": MANIFEST_SCHEMA, "key": "0" * 64, "key_inputs": {}, "framework": "torch",
                            "versions": {}, "target": {}, "recipe": {}, "buckets": PLACEHOLDER_BUCKETS, "files": []}
    return Manifest.model_validate({**base, **fields})
