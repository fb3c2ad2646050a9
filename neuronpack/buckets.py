"""Bucket plans and routing, matching NxD Inference and transformers-neuronx exactly (see docs/neuron.md, "Facts
the code relies on").

A bucket is a compiled sequence length. Context-encoding buckets are sized by prompt length (max:
max_context_length), token-generation buckets by attention length (max: seq_len).

Example::

    >>> plan_buckets(seq_len=1024)
    BucketPlan(context=(128, 256, 512, 1024), token_generation=(128, 256, 512, 1024), ...)
    >>> route((128, 256, 512), 128)         # first bucket with length < bucket; equal to the largest uses it
    256
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from neuronpack.errors import BucketError

NXD_MIN_BUCKET = 128


@dataclass(frozen=True)
class BucketPlan:
    context: tuple[int, ...]
    token_generation: tuple[int, ...]
    max_context_length: int
    seq_len: int

    def to_dict(self) -> dict:
        return {
            "context": list(self.context),
            "token_generation": list(self.token_generation),
            "max_context_length": self.max_context_length,
            "seq_len": self.seq_len,
        }


def auto_buckets(maximum: int, minimum: int = NXD_MIN_BUCKET) -> tuple[int, ...]:
    """NxDI's generate_buckets: powers of two from ``minimum`` below ``maximum``, then ``maximum`` itself."""
    if maximum <= minimum:
        return (maximum,)
    lo = int(math.log2(minimum))
    hi = round(math.log2(maximum))
    buckets = [2**i for i in range(lo, hi)] + [maximum]
    return tuple(sorted(set(buckets)))


def explicit_buckets(values: Sequence[int], maximum: int, *, name: str) -> tuple[int, ...]:
    """Sort and deduplicate an explicit bucket list; every bucket must be in 1..maximum."""
    if not values:
        raise BucketError(f"{name} bucket list is empty", where=name, fix='give at least one length or use "auto"')
    out = sorted(set(int(v) for v in values))
    if out[0] < 1:
        raise BucketError(f"{name} bucket {out[0]} is not positive", where=name, fix="use lengths >= 1")
    if out[-1] > maximum:
        raise BucketError(
            f"{name} bucket {out[-1]} is larger than its maximum {maximum}",
            where=name,
            fix=f"drop buckets above {maximum} or raise the sequence length",
        )
    return tuple(out)


def plan_buckets(
    seq_len: int,
    max_context_length: int | None = None,
    *,
    enabled: bool = True,
    context: Sequence[int] | str | None = "auto",
    token_generation: Sequence[int] | str | None = "auto",
    min_bucket: int = NXD_MIN_BUCKET,
) -> BucketPlan:
    """The bucket plan NxDI would build for these settings (auto formula, explicit lists, or bucketing off)."""
    if seq_len < 1:
        raise BucketError(f"seq_len must be positive, got {seq_len}", where="seq_len", fix="set seq_len >= 1")
    mcl = seq_len if max_context_length is None else max_context_length
    if not 1 <= mcl <= seq_len:
        raise BucketError(
            f"max_context_length {mcl} must be between 1 and seq_len {seq_len}",
            where="max_context_length",
            fix="lower max_context_length or raise seq_len",
        )
    if not enabled:
        return BucketPlan((mcl,), (seq_len,), mcl, seq_len)
    ctx = (
        auto_buckets(mcl, min_bucket)
        if context in (None, "auto")
        else explicit_buckets(context, mcl, name="context")  # type: ignore[arg-type]
    )
    tkg = (
        auto_buckets(seq_len, min_bucket)
        if token_generation in (None, "auto")
        else explicit_buckets(token_generation, seq_len, name="token_generation")  # type: ignore[arg-type]
    )
    return BucketPlan(ctx, tkg, mcl, seq_len)


def route(buckets: Sequence[int], length: int, speculation_length: int = 0) -> int:
    """NxDI first fit: the first bucket with length + speculation_length < bucket; a length equal to the largest
    bucket uses it; anything longer raises BucketError."""
    if not buckets:
        raise BucketError("no buckets to route to", fix="compile with at least one bucket")
    need = length + speculation_length
    for bucket in buckets:
        if need < bucket:
            return bucket
    largest = buckets[-1]
    if need == largest:
        return largest
    raise BucketError(
        f"length {length}{f' + speculation {speculation_length}' if speculation_length else ''} exceeds the largest "
        f"bucket {largest}",
        where=f"buckets {list(buckets)}",
        fix="shorten the input or compile with a larger seq_len / max_context_length",
    )


def route_tnx(buckets: Sequence[int], length: int) -> int:
    """transformers-neuronx routing: the smallest bucket >= length."""
    if not buckets:
        raise BucketError("no buckets to route to", fix="compile with at least one bucket")
    for bucket in sorted(buckets):
        if bucket >= length:
            return bucket
    raise BucketError(
        f"length {length} exceeds the largest bucket {max(buckets)}",
        where=f"buckets {sorted(buckets)}",
        fix="shorten the input or compile with larger n_positions",
    )


def parse_tnx_bucket_env(value: str | None, default: int) -> tuple[int, ...]:
    """Parse NEURON_CONTEXT_LENGTH_BUCKETS / NEURON_TOKEN_GEN_BUCKETS as vLLM does: comma separated ints, empty
    entries dropped; unset or empty -> (default,) (max_model_len)."""
    if not value or not value.strip():
        return (default,)
    out = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            out.append(int(part))
        except ValueError:
            raise BucketError(
                f"bucket {part!r} is not an integer", where=value, fix="use comma separated integers like 128,512"
            ) from None
    return tuple(out) if out else (default,)


def plan_from_tnx_env(env: Mapping[str, str], max_model_len: int) -> BucketPlan:
    """The plan vLLM's transformers-neuronx path would use for these environment variables."""
    ctx = parse_tnx_bucket_env(env.get("NEURON_CONTEXT_LENGTH_BUCKETS"), max_model_len)
    tkg = parse_tnx_bucket_env(env.get("NEURON_TOKEN_GEN_BUCKETS"), max_model_len)
    return BucketPlan(tuple(sorted(set(ctx))), tuple(sorted(set(tkg))), max(ctx), max(max(tkg), max_model_len))
