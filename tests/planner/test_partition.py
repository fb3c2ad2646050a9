"""The planner's dynamic programme is exact: on small samples its plan's padding equals the best of every admissible
bucket list (brute force), and the buckets it returns give that padding when routed."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuronpack.errors import BucketError
from neuronpack.planner.partition import optimal_partitions, padding_of, route_length


def brute_force(demand: dict[int, int], maximum: int, k: int, strict: bool, allowed) -> float:
    values = [v for v in range(1, maximum) if allowed(v)]
    best = None
    for size in range(k):
        for chosen in itertools.combinations(values, size):
            cost = padding_of((*chosen, maximum), demand, strict=strict)
            best = cost if best is None else min(best, cost)
    return best


@st.composite
def samples(draw):
    maximum = draw(st.integers(2, 40))
    demand = draw(st.dictionaries(st.integers(1, maximum), st.integers(1, 9), min_size=1, max_size=12))
    return maximum, demand, draw(st.integers(1, 4)), draw(st.booleans()), draw(st.sampled_from([1, 2, 4, 8]))


@settings(max_examples=300, deadline=None)
@given(samples())
def test_plan_is_optimal_against_brute_force(sample):
    maximum, demand, k, strict, align = sample
    plans = optimal_partitions(demand, maximum=maximum, max_buckets=k, strict=strict,
                               round_up=lambda v: -(-v // align) * align)
    plan = plans[-1]
    assert plan.buckets[-1] == maximum and list(plan.buckets) == sorted(set(plan.buckets))
    assert len(plan.buckets) <= k
    assert all(b % align == 0 for b in plan.buckets[:-1])
    assert padding_of(plan.buckets, demand, strict=strict) == plan.padding
    assert plan.padding == brute_force(demand, maximum, k, strict, lambda v: v % align == 0)
    assert [p.padding for p in plans] == sorted((p.padding for p in plans), reverse=True)  # more never worse


def test_nxd_first_fit_is_strict():
    assert route_length((128, 256, 512), 128, strict=True) == 256
    assert route_length((128, 256, 512), 512, strict=True) == 512
    assert route_length((128, 256, 512), 128, strict=False) == 128
    with pytest.raises(BucketError, match="exceeds the largest bucket 512"):
        route_length((128, 256, 512), 513, strict=True)


def test_large_sample_is_fast_and_exact_on_its_curve():
    demand = {length: 1 + length % 7 for length in range(1, 8193)}
    plans = optimal_partitions(demand, maximum=8192, max_buckets=16, strict=True)
    assert len(plans) == 16 and plans[-1].padding < plans[0].padding
    for plan in plans:
        assert padding_of(plan.buckets, demand, strict=True) == plan.padding
