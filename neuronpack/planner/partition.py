"""Exact optimal buckets for one dimension (prompt length, KV length or batch size) of a weighted sample.

A plan of at most ``k`` buckets, the largest always ``maximum`` (every admissible request must fit), is chosen to
minimise the padding ``sum(weight * (route(length) - length))``: a partition of the sorted distinct lengths into
consecutive groups, each served by one bucket. The only buckets worth considering are, for each distinct length,
the smallest admissible value that serves it (``round_up(length + 1)`` under NxD Inference's strict first fit,
``round_up(length)`` under "smallest bucket >= length"): lowering a bucket to that value never adds padding. Over
those candidates the optimum is a dynamic programme, one layer per bucket; each layer is a minimum over lines (the
padding of a group is linear in the bucket value), evaluated with a monotone convex-hull scan, so a layer costs O(m)
for m candidates and exact integer arithmetic gives exact plans for integer weights.

Example::

    >>> plans = optimal_partitions({100: 3, 300: 1, 900: 1}, maximum=1024, max_buckets=3, strict=True)
    >>> plans[2].buckets, plans[2].padding          # the best plan of at most 3 buckets
    ((101, 301, 1024), 128)
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from neuronpack.errors import BucketError


@dataclass(frozen=True)
class Partition:
    """A bucket list (sorted, the last one the maximum) and the padding it gives the sample."""

    buckets: tuple[int, ...]
    padding: float


def route_length(buckets: Sequence[int], length: int, *, strict: bool) -> int:
    """The bucket a length runs in: ``strict`` is NxD Inference's first fit (the first bucket with length < bucket;
    a length equal to the largest uses it), otherwise the smallest bucket >= length. BucketError past the largest."""
    index = bisect.bisect_right(buckets, length) if strict else bisect.bisect_left(buckets, length)
    if index < len(buckets):
        return buckets[index]
    if buckets and length == buckets[-1]:
        return buckets[-1]
    raise BucketError(f"length {length} exceeds the largest bucket {buckets[-1] if buckets else None}",
                      where=f"buckets {list(buckets)}", fix="plan with a larger maximum")


def padding_of(buckets: Sequence[int], demand: Mapping[int, float], *, strict: bool) -> float:
    """``sum(weight * (bucket - length))`` over the sample, routed as ``route_length`` does."""
    return sum(w * (route_length(buckets, length, strict=strict) - length) for length, w in demand.items())


def optimal_partitions(demand: Mapping[int, float], *, maximum: int, max_buckets: int, strict: bool,
                       round_up: Callable[[int], int] = int) -> list[Partition]:
    """The best plan with at most 1, 2, ..., ``max_buckets`` buckets (index k - 1), every bucket a value
    ``round_up`` returns (or ``maximum``), the last one ``maximum``. ``demand`` maps each length (1..maximum) to its
    weight (> 0). Fewer plans come back when the sample has fewer distinct candidates than ``max_buckets``."""
    lengths = sorted(length for length, w in demand.items() if w > 0)
    if lengths and (lengths[0] < 0 or lengths[-1] > maximum):
        raise BucketError(f"length {lengths[-1] if lengths[-1] > maximum else lengths[0]} is outside 0..{maximum}",
                          where="bucket planning", fix="drop such requests or raise the maximum")
    values = sorted({min(max(round_up(length + strict), 1), maximum) for length in lengths} | {maximum})
    cell_weight, cell_sum = [0] * len(values), [0] * len(values)
    for length in lengths:
        cell = min(bisect.bisect_right(values, length) if strict else bisect.bisect_left(values, length),
                   len(values) - 1)
        cell_weight[cell] += demand[length]
        cell_sum[cell] += demand[length] * length
    prefix_w, prefix_s = _prefix(cell_weight), _prefix(cell_sum)
    layers = [[values[t] * prefix_w[t + 1] - prefix_s[t + 1] for t in range(len(values))]]
    parents: list[list[int]] = [[-1] * len(values)]
    for _ in range(1, min(max_buckets, len(values))):
        best, parent = _next_layer(layers[-1], values, prefix_w, prefix_s)
        layers.append(best)
        parents.append(parent)
    return [Partition(_buckets(parents, k, values), layers[k][-1]) for k in range(len(layers))]


# --- private ---------------------------------------------------------------------------------------------------------
def _prefix(values: list) -> list:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


def _next_layer(previous: list, values: list[int], prefix_w: list, prefix_s: list) -> tuple[list, list[int]]:
    """One more bucket: best[t] = min(previous[t], min over s < t of previous[s] + the padding of cells s+1..t in
    bucket values[t]). The inner minimum is over lines y = -W(s) * x + (previous[s] + S(s)) at x = values[t]: slopes
    fall as s grows and x rises with t, so a pointer walks the lower hull once."""
    hull: list[tuple] = []  # (slope, intercept, s)
    pointer = 0
    best, parent = list(previous), [-1] * len(values)
    for t in range(1, len(values)):
        line = (-prefix_w[t], previous[t - 1] + prefix_s[t], t - 1)
        while len(hull) >= 2 and _useless(hull[-2], hull[-1], line):
            hull.pop()
        hull.append(line)
        pointer = min(pointer, len(hull) - 1)
        x = values[t]
        while pointer + 1 < len(hull) and _at(hull[pointer + 1], x) <= _at(hull[pointer], x):
            pointer += 1
        value = _at(hull[pointer], x) + x * prefix_w[t + 1] - prefix_s[t + 1]
        if value < best[t]:
            best[t], parent[t] = value, hull[pointer][2]
    return best, parent


def _at(line: tuple, x: int):
    return line[0] * x + line[1]


def _useless(first: tuple, middle: tuple, last: tuple) -> bool:
    """``middle`` never is the lowest: ``last`` overtakes ``first`` no later than ``middle`` does (slopes fall)."""
    (a1, b1, _), (a2, b2, _), (a3, b3, _) = first, middle, last
    if a2 == a3:
        return b3 <= b2
    return (b3 - b1) * (a1 - a2) <= (b2 - b1) * (a1 - a3)


def _buckets(parents: list[list[int]], k: int, values: list[int]) -> tuple[int, ...]:
    out, t = [], len(values) - 1
    while t >= 0 and k >= 0:
        if parents[k][t] == -1 and k > 0:  # this layer kept the plan of one bucket fewer
            k -= 1
            continue
        out.append(values[t])
        t, k = parents[k][t], k - 1
    return tuple(reversed(out))
