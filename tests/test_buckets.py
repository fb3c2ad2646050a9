import math

import pytest

from neuronpack.buckets import (
    auto_buckets,
    parse_tnx_bucket_env,
    plan_buckets,
    plan_from_tnx_env,
    route,
    route_tnx,
)
from neuronpack.errors import BucketError


def nxd_generate_buckets(min_length: int, max_length: int) -> list[int]:
    """NxD Inference's published formula, written out independently as the reference."""
    if min_length == max_length:
        return [max_length]
    return [2**i for i in range(int(math.log2(min_length)), round(math.log2(max_length)))] + [max_length]


@pytest.mark.parametrize("maximum", [128, 200, 256, 1000, 1024, 3000, 4096, 6000, 8192, 32768, 131072])
def test_auto_buckets_match_nxd_formula(maximum):
    assert list(auto_buckets(maximum)) == sorted(set(nxd_generate_buckets(128, maximum)))


def test_plan_defaults_and_explicit_lists():
    plan = plan_buckets(8192)
    assert plan.context == plan.token_generation == (128, 256, 512, 1024, 2048, 4096, 8192)
    plan = plan_buckets(1024, 512, context=[512, 128, 128], token_generation=[1024, 256])
    assert plan.context == (128, 512)
    assert plan.token_generation == (256, 1024)
    assert plan.to_dict()["max_context_length"] == 512


def test_bucketing_off_gives_one_bucket_each():
    plan = plan_buckets(4096, 2048, enabled=False)
    assert plan.context == (2048,) and plan.token_generation == (4096,)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(seq_len=1024, context=[2048]), "larger than its maximum 1024"),
        (dict(seq_len=1024, token_generation=[0, 128]), "not positive"),
        (dict(seq_len=1024, context=[]), "empty"),
        (dict(seq_len=1024, max_context_length=2048), "between 1 and seq_len"),
        (dict(seq_len=0), "positive"),
    ],
)
def test_plan_errors(kwargs, message):
    with pytest.raises(BucketError, match=message):
        plan_buckets(**kwargs)


def test_route_first_fit_with_speculation():
    buckets = (128, 256, 512)
    assert route(buckets, 1) == 128
    assert route(buckets, 127) == 128
    assert route(buckets, 128) == 256  # strictly less than the bucket
    assert route(buckets, 512) == 512  # equal to the largest uses it
    assert route(buckets, 124, speculation_length=4) == 256
    assert route(buckets, 508, speculation_length=4) == 512
    with pytest.raises(BucketError, match="exceeds the largest bucket 512"):
        route(buckets, 513)
    with pytest.raises(BucketError, match="speculation 4"):
        route(buckets, 510, speculation_length=4)


def test_tnx_routing_and_env_parsing():
    assert route_tnx((128, 512), 128) == 128
    assert route_tnx((512, 128), 129) == 512
    with pytest.raises(BucketError):
        route_tnx((128,), 129)
    assert parse_tnx_bucket_env("128, ,512,", 4096) == (128, 512)
    assert parse_tnx_bucket_env("", 4096) == (4096,)
    assert parse_tnx_bucket_env(None, 4096) == (4096,)
    with pytest.raises(BucketError, match="not an integer"):
        parse_tnx_bucket_env("128,abc", 4096)
    plan = plan_from_tnx_env({"NEURON_CONTEXT_LENGTH_BUCKETS": "512,128", "NEURON_TOKEN_GEN_BUCKETS": ""}, 2048)
    assert plan.context == (128, 512) and plan.token_generation == (2048,)
