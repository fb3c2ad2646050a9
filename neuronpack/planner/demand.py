"""What a request log asks of each bucketed dimension, and what a plan's padding costs it.

Per request of P prompt tokens (C cached) generating G tokens, as the frameworks run it:

- prefill: one call of P tokens (P - C where a prefix cache skips the cached ones), split into chunks of the
  framework's prefill chunk where it has one (vLLM's chunked prefill, the portable runtime);
- decode: the first token comes from the prefill; each of the G - 1 steps after it attends to a KV length of
  P + j (j = 1 .. G - 1, NxDI's attention-mask width), plus the speculation length under NxDI's fused speculation;
- batch: those G - 1 steps ran with ``batch`` rows, so the request accounts for (G - 1) / batch batch steps.

Each request is routed on its own: exact at batch 1; in a mixed batch NxDI and the plugin pick the KV bucket of the
batch's longest row, which pads more under every plan alike.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

from neuronpack.errors import TrafficError
from neuronpack.planner.frameworks import FrameworkRules
from neuronpack.planner.partition import route_length
from neuronpack.traffic import Traffic


@dataclass(frozen=True)
class Demand:
    """Weighted lengths per dimension (empty when the log does not say: no completion_tokens / batch)."""

    context: dict[int, float]
    token_generation: dict[int, float]
    batch: dict[int, float]
    requests: int
    decode_steps: int
    mean_kv_length: float


def prefill_chunks(rules: FrameworkRules, prompt: int, cached: int) -> list[int]:
    tokens = max(prompt - cached, 1) if rules.prefill_skips_cached else prompt
    chunk = rules.prefill_chunk
    if chunk is None:
        return [tokens]
    return [chunk] * (tokens // chunk) + ([tokens % chunk] if tokens % chunk else [])


def build_demand(traffic: Traffic, rules: FrameworkRules) -> Demand:
    """The log's demand on each dimension. TrafficError names the first request past the recipe's limits."""
    context: Counter = Counter()
    steps_from = Counter()  # difference array over KV lengths: +1 at the first, -1 past the last
    batch: Counter = Counter()
    steps = kv_sum = 0
    for number, r in enumerate(traffic.records, 1):
        _check_limits(r, rules, f"request {number} of {traffic.path}")
        for chunk in prefill_chunks(rules, r.prompt_tokens, r.cached_tokens or 0):
            context[chunk] += 1
        n = (r.completion_tokens or 1) - 1
        if n > 0:
            first = r.prompt_tokens + 1 + rules.speculation
            steps_from[first] += 1
            steps_from[first + n] -= 1
            steps += n
            kv_sum += n * (2 * first + n - 1) / 2
            if r.batch is not None:
                batch[min(r.batch, rules.batch.maximum)] += n / r.batch
    return Demand(dict(context), _integrate(steps_from), dict(batch), len(traffic.records), steps,
                  kv_sum / steps if steps else 0.0)


@dataclass(frozen=True)
class Padding:
    """What a plan pads, on the sample."""

    prompt_mean: float  # padded prompt tokens per request
    prompt_p50: float
    prompt_p90: float
    kv_per_token: float  # padded KV positions per generated token (decode steps)
    kv_p50: float  # per request: its padded KV positions per decode step
    kv_p90: float
    rows_per_step: float  # padded batch rows per decode step

    def to_dict(self) -> dict:
        return {k: round(v, 3) for k, v in self.__dict__.items()}


def measure(traffic: Traffic, rules: FrameworkRules, context: tuple[int, ...], token_generation: tuple[int, ...],
            batch: tuple[int, ...]) -> Padding:
    """The padding of a plan on every request of the sample, routed as the framework routes."""
    if rules.framework == "torch":
        return Padding(0, 0, 0, 0, 0, 0, 0)
    strict_decode = rules.token_generation.strict
    prompt, kv_request, kv_total, steps, rows, batch_steps = [], [], 0, 0, 0.0, 0.0
    for r in traffic.records:
        prompt.append(sum(route_length(context, c, strict=rules.context.strict) - c
                          for c in prefill_chunks(rules, r.prompt_tokens, r.cached_tokens or 0)))
        n = (r.completion_tokens or 1) - 1
        if n > 0:
            first = r.prompt_tokens + 1 + rules.speculation
            padded = range_padding(token_generation, first, first + n - 1, strict=strict_decode)
            kv_request.append(padded / n)
            kv_total += padded
            steps += n
            if r.batch is not None:
                b = min(r.batch, rules.batch.maximum)
                rows += n / r.batch * (route_length(batch, b, strict=False) - b)
                batch_steps += n / r.batch
    return Padding(statistics.fmean(prompt), _quantile(prompt, 0.5), _quantile(prompt, 0.9),
                   kv_total / steps if steps else 0.0, _quantile(kv_request, 0.5), _quantile(kv_request, 0.9),
                   rows / batch_steps if batch_steps else 0.0)


def range_padding(buckets: tuple[int, ...], low: int, high: int, *, strict: bool) -> int:
    """``sum(route(L) - L for L in low..high)`` in closed form, one term per bucket the range crosses."""
    total, start = 0, low
    for index, bucket in enumerate(buckets):
        last = bucket - 1 if strict else bucket  # the longest length this bucket serves
        if strict and index == len(buckets) - 1:
            last = bucket  # a length equal to the largest uses it
        end = min(last, high)
        if end >= start:
            count = end - start + 1
            total += count * bucket - (start + end) * count // 2
            start = end + 1
        if start > high:
            return total
    route_length(buckets, start, strict=strict)  # raises: past the largest bucket
    return total


# --- private ---------------------------------------------------------------------------------------------------------
def _check_limits(r, rules: FrameworkRules, where: str) -> None:
    if r.prompt_tokens > rules.max_prompt:
        raise TrafficError(f"a prompt of {r.prompt_tokens} tokens is past the model's maximum prompt of "
                           f"{rules.max_prompt}", where=where,
                           fix="raise target.max_context_length / seq_len in the recipe, or drop such requests")
    total = r.prompt_tokens + (r.completion_tokens or 0) + rules.speculation
    if total > rules.token_generation.maximum:
        raise TrafficError(f"{r.prompt_tokens} prompt + {r.completion_tokens} completion tokens"
                           f"{f' + speculation {rules.speculation}' if rules.speculation else ''} are past seq_len "
                           f"{rules.token_generation.maximum}", where=where,
                           fix="raise target.seq_len in the recipe, or drop such requests")


def _integrate(diff: Counter) -> dict[int, float]:
    out, running, points = {}, 0, sorted(diff)
    for here, after in zip(points, [*points[1:], None], strict=True):
        running += diff[here]
        if running and after is not None:
            out.update(dict.fromkeys(range(here, after), running))
    return out


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]
