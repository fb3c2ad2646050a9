"""Fuzz bucket planning and routing against the invariants of neuron-facts.md: plans are sorted, unique and within
their maximum (auto plans follow NxDI's powers-of-two formula and end at the maximum); NxDI routing is first fit
(first bucket with length + speculation < bucket, the largest bucket taken on equality, longer refused); TNx routing
is the smallest bucket >= length. Bad values raise BucketError (one line), and the `buckets` command exits 0/1/2."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from typer.testing import CliRunner

from neuronpack.buckets import (
    NXD_MIN_BUCKET,
    auto_buckets,
    parse_tnx_bucket_env,
    plan_buckets,
    plan_from_tnx_env,
    route,
    route_tnx,
)
from neuronpack.errors import BucketError

from . import assert_one_line, fuzz_settings

lengths = st.integers(-4, 5000)
bucket_lists = st.none() | st.just("auto") | st.lists(st.integers(-3, 6000), max_size=6)


def _check_sorted_within(buckets: tuple[int, ...], maximum: int) -> None:
    assert buckets and list(buckets) == sorted(set(buckets)), buckets
    assert 1 <= buckets[0] and buckets[-1] <= maximum


@fuzz_settings(500)
@given(seq_len=lengths, mcl=st.none() | lengths, enabled=st.booleans(), context=bucket_lists,
       token_generation=bucket_lists, min_bucket=st.sampled_from([NXD_MIN_BUCKET, 1, 16, 100]))
def test_plan_invariants(seq_len, mcl, enabled, context, token_generation, min_bucket):
    try:
        plan = plan_buckets(seq_len, mcl, enabled=enabled, context=context, token_generation=token_generation,
                            min_bucket=min_bucket)
    except BucketError as exc:
        assert_one_line(exc)
        return
    assert 1 <= plan.max_context_length <= plan.seq_len == seq_len
    _check_sorted_within(plan.context, plan.max_context_length)
    _check_sorted_within(plan.token_generation, plan.seq_len)
    if not enabled:
        assert plan.context == (plan.max_context_length,) and plan.token_generation == (seq_len,)
        return
    for got, given_list, maximum in ((plan.context, context, plan.max_context_length),
                                     (plan.token_generation, token_generation, seq_len)):
        if given_list in (None, "auto"):
            _check_auto(got, maximum, min_bucket)
        else:
            assert got == tuple(sorted(set(given_list)))


def _check_auto(buckets: tuple[int, ...], maximum: int, minimum: int) -> None:
    """NxDI's generate_buckets: [2**i for i in range(int(log2(min)), round(log2(max)))] + [max]."""
    assert buckets[-1] == maximum
    if maximum <= minimum:
        assert buckets == (maximum,)
        return
    powers = buckets[:-1]
    assert all(b & (b - 1) == 0 for b in powers)
    assert all(b2 == 2 * b1 for b1, b2 in zip(powers, powers[1:], strict=False))
    if powers:
        assert powers[0] == 2 ** int(math.log2(minimum))
        assert 2 * powers[-1] == 2 ** round(math.log2(maximum)) or 2 * powers[-1] == maximum


@fuzz_settings(300)
@given(maximum=st.integers(1, 2**21), minimum=st.integers(1, 4096))
def test_auto_buckets_end_at_the_maximum(maximum, minimum):
    _check_auto(auto_buckets(maximum, minimum), maximum, minimum)


@fuzz_settings(500)
@given(buckets=st.lists(st.integers(1, 5000), min_size=1, max_size=6).map(lambda b: tuple(sorted(set(b)))),
       length=st.integers(0, 5200), spec=st.integers(0, 8))
def test_route_is_first_fit(buckets, length, spec):
    need = length + spec
    try:
        got = route(buckets, length, spec)
    except BucketError as exc:
        assert_one_line(exc)
        assert need > buckets[-1]
        return
    assert got in buckets
    assert need < got or need == got == buckets[-1]
    assert all(need >= b for b in buckets[: buckets.index(got)])  # no earlier bucket fits


@fuzz_settings(400)
@given(buckets=st.lists(st.integers(1, 5000), max_size=6), length=st.integers(0, 5200))
@example(buckets=[], length=1)  # regression: ValueError from max(()) on an empty bucket list
def test_route_tnx_is_smallest_at_least(buckets, length):
    try:
        got = route_tnx(buckets, length)
    except BucketError as exc:
        assert_one_line(exc)
        assert not buckets or length > max(buckets)
        return
    assert got >= length and got == min(b for b in buckets if b >= length)


@fuzz_settings(400)
@given(value=st.none() | st.text(max_size=24) | st.lists(st.integers(-5, 3000).map(str) | st.just(" "), max_size=5)
       .map(",".join), default=st.integers(1, 4096))
def test_tnx_env_parsing(value, default):
    try:
        parsed = parse_tnx_bucket_env(value, default)
    except BucketError as exc:
        assert_one_line(exc)
        return
    assert parsed and all(isinstance(b, int) for b in parsed)
    try:
        env = {"NEURON_CONTEXT_LENGTH_BUCKETS": value or "", "NEURON_TOKEN_GEN_BUCKETS": value or ""}
        plan = plan_from_tnx_env(env, default)
    except BucketError as exc:
        assert_one_line(exc)
        return
    assert list(plan.context) == sorted(set(plan.context)) and plan.seq_len >= default


cli_numbers = st.sampled_from(["0", "-1", "1", "128", "1024", "4096", "x", "1.5", "", "99999999999999999999"])
cli_lists = st.none() | st.sampled_from(["auto", "", ",", "64,32", "128,0", "a,b", "1e3", "5000", " 16 , 32 "])


@fuzz_settings(120)
@given(seq_len=cli_numbers, mcl=st.none() | cli_numbers, context=cli_lists, token_gen=cli_lists,
       no_bucketing=st.booleans(), json_format=st.booleans())
def test_buckets_command_exits_cleanly(seq_len, mcl, context, token_gen, no_bucketing, json_format):
    from neuronpack.cli.app import app

    args = ["buckets", "--seq-len", seq_len]
    for flag, value in (("--max-context-length", mcl), ("--context", context), ("--token-gen", token_gen)):
        if value is not None:
            args += [flag, value]
    args += ["--no-bucketing"] * no_bucketing + ["--format", "json"] * json_format
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, 1, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output


def test_route_tnx_without_buckets_is_a_bucket_error():
    """Regression: an empty bucket list raised ValueError (max of an empty sequence)."""
    with pytest.raises(BucketError, match="no buckets"):
        route_tnx((), 1)
