"""BuildRequests for the torch backend's own tests: a tiny recipe (batch 2, seq_len 128, two buckets of each kind)."""

from __future__ import annotations

from pathlib import Path

from neuronpack.backends.base import BuildRequest
from neuronpack.buckets import plan_buckets
from neuronpack.recipe import Recipe

BUCKETS = {"context": [16, 64], "token_generation": [64, 128]}


def tiny_request(model_dir: Path, staging: Path, *, compiler="export", batch_size=2, **recipe) -> BuildRequest:
    data = {"compiler": compiler, "buckets": BUCKETS,
            "target": {"batch_size": batch_size, "seq_len": 128, "max_context_length": 64}, **recipe}
    parsed = Recipe.model_validate(data)
    plan = plan_buckets(parsed.target.seq_len, parsed.max_context_length, context=parsed.buckets.context,
                        token_generation=parsed.buckets.token_generation)
    staging.mkdir(parents=True, exist_ok=True)
    return BuildRequest(model_dir=model_dir, recipe=parsed, plan=plan, staging=staging)
