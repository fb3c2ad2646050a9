"""Prometheus metrics of one engine (its own registry, so several engines in one process never collide).

Names follow vLLM's where one exists (``num_requests_running``, ``time_to_first_token_seconds``,
``inter_token_latency_seconds``, and with speculation vLLM V1's ``spec_decode_num_drafts``,
``spec_decode_num_draft_tokens``, ``spec_decode_num_accepted_tokens``, ``spec_decode_num_accepted_tokens_per_pos``
{position}, vLLM's ``prefix_cache_queries`` / ``prefix_cache_hits``, in prompt tokens, and its per-request
``request_prompt_tokens`` / ``request_generation_tokens`` histograms, on vLLM's 1-2-5 boundaries up to the model
length) under a ``neuronpack_`` prefix (the prefix cache's hit rate: ``rate(neuronpack_prefix_cache_hits_total) /
rate(neuronpack_prefix_cache_queries_total)``; what it holds: ``neuronpack_prefix_cache_usage_bytes``, the
KV-cache rows beyond the batch that keep a prefix, never above ``neuronpack_prefix_cache_budget_bytes``, the
``--prefix-cache-memory`` budget; the batch's free rows keep prefixes too, at no extra cost). As in vLLM, the
acceptance rate is
``rate(neuronpack_spec_decode_num_accepted_tokens_total) / rate(neuronpack_spec_decode_num_draft_tokens_total)`` and
the mean acceptance length ``1 + rate(..._num_accepted_tokens_total) / rate(..._num_drafts_total)``.

Example::

    metrics = EngineMetrics()
    metrics.observe_first_token(0.05)
    text = metrics.render()        # Prometheus text exposition format
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from neuronpack.runtime.engine.speculation.stats import SpecStats

PREFIX = "neuronpack"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5,
                   5.0, 10.0, 30.0)
OCCUPANCY_BUCKETS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)


class EngineMetrics:
    """Counters, gauges and histograms the engine updates; ``render()`` is what /metrics serves."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, batch_size: int = 1, speculation_length: int = 0, max_model_len: int = 1) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.batch_size = batch_size
        # vLLM's names, documentation and boundaries (vllm:request_prompt_tokens in 0.9 through 0.24)
        self.request_prompt_tokens = Histogram(f"{PREFIX}_request_prompt_tokens", "Number of prefill tokens "
                                               "processed.", buckets=one_two_five(max_model_len), registry=r)
        self.request_generation_tokens = Histogram(f"{PREFIX}_request_generation_tokens", "Number of generation "
                                                   "tokens processed.", buckets=one_two_five(max_model_len),
                                                   registry=r)
        self.requests = Counter(f"{PREFIX}_requests", "Finished requests by finish reason "
                                "(stop, length, abort, timeout, error)", ["finish_reason"], registry=r)
        self.rejected = Counter(f"{PREFIX}_requests_rejected", "Requests refused before reaching a slot, by reason "
                                "(queue_full, shutting_down, body_too_large)", ["reason"], registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens (those found in the prefix cache "
                                     "included, as vLLM counts them)", registry=r)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "Tokens generated", registry=r)
        self.prefix_cache_queries = Counter(f"{PREFIX}_prefix_cache_queries", "Prefix cache queries, in terms of "
                                            "number of queried tokens.", registry=r)
        self.prefix_cache_hits = Counter(f"{PREFIX}_prefix_cache_hits", "Prefix cache hits, in terms of number of "
                                         "cached tokens.", registry=r)
        self.prefix_cache_usage = Gauge(f"{PREFIX}_prefix_cache_usage_bytes", "Bytes of the KV-cache rows beyond "
                                        "the batch that hold a cached prefix (whole rows)", registry=r)
        self.prefix_cache_budget = Gauge(f"{PREFIX}_prefix_cache_budget_bytes", "The prefix cache's memory "
                                         "budget (--prefix-cache-memory; 0 when prefix caching is off)", registry=r)
        self.waiting = Gauge(f"{PREFIX}_num_requests_waiting", "Requests queued for a free batch slot "
                             "(queue depth)", registry=r)
        self.running = Gauge(f"{PREFIX}_num_requests_running", "Requests holding a batch slot", registry=r)
        self.occupancy = Gauge(f"{PREFIX}_batch_occupancy", "Fraction of batch slots in use right now", registry=r)
        self.step_occupancy = Histogram(f"{PREFIX}_decode_batch_occupancy", "Fraction of batch slots in use per "
                                        "decode step", buckets=OCCUPANCY_BUCKETS, registry=r)
        self.batch_slots = Gauge(f"{PREFIX}_batch_slots", "Batch slots compiled into the artifact", registry=r)
        self.batch_slots.set(batch_size)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds", "Arrival to first generated token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(f"{PREFIX}_inter_token_latency_seconds", "Time between two tokens of one request",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(f"{PREFIX}_e2e_request_latency_seconds", "Arrival to finish",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.prefill_seconds = Histogram(f"{PREFIX}_prefill_seconds", "Duration of one prefill call",
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.decode_seconds = Histogram(f"{PREFIX}_decode_step_seconds", "Duration of one decode step",
                                        buckets=LATENCY_BUCKETS, registry=r)
        self.speculation_length = speculation_length
        if speculation_length:  # registered only when the engine speculates, as vLLM does
            self.spec_drafts = Counter(f"{PREFIX}_spec_decode_num_drafts", "Number of spec decoding drafts.",
                                       registry=r)
            self.spec_draft_tokens = Counter(f"{PREFIX}_spec_decode_num_draft_tokens", "Number of draft tokens.",
                                             registry=r)
            self.spec_accepted_tokens = Counter(f"{PREFIX}_spec_decode_num_accepted_tokens",
                                                "Number of accepted tokens.", registry=r)
            per_pos = Counter(f"{PREFIX}_spec_decode_num_accepted_tokens_per_pos",
                              "Accepted tokens per draft position.", ["position"], registry=r)
            self.spec_accepted_per_pos = [per_pos.labels(position=str(i)) for i in range(speculation_length)]

    def set_load(self, waiting: int, running: int) -> None:
        self.waiting.set(waiting)
        self.running.set(running)
        self.occupancy.set(running / self.batch_size)

    def observe_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def observe_finish(self, finish_reason: str, seconds: float, prompt_tokens: int, generation_tokens: int) -> None:
        """A request ended after ``seconds`` with a prompt of ``prompt_tokens`` (cached ones included) and
        ``generation_tokens`` generated."""
        self.requests.labels(finish_reason=finish_reason).inc()
        self.e2e.observe(seconds)
        self.request_prompt_tokens.observe(prompt_tokens)
        self.request_generation_tokens.observe(generation_tokens)

    def observe_prefix_cache(self, queried: int, hit: int) -> None:
        """A prompt of ``queried`` tokens was looked up in the prefix cache; its first ``hit`` were cached."""
        self.prefix_cache_queries.inc(queried)
        self.prefix_cache_hits.inc(hit)

    def observe_speculation(self, step: SpecStats) -> None:
        """Add one speculative step's counts (all its sequences together)."""
        self.spec_drafts.inc(step.num_drafts)
        self.spec_draft_tokens.inc(step.num_draft_tokens)
        self.spec_accepted_tokens.inc(step.num_accepted_tokens)
        for counter, count in zip(self.spec_accepted_per_pos, step.num_accepted_tokens_per_pos, strict=True):
            counter.inc(count)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


def one_two_five(maximum: int) -> list[int]:
    """vLLM's histogram boundaries for token counts (``build_1_2_5_buckets``): 1, 2, 5 times the powers of ten, up to
    ``maximum`` (the model length).

    Example: ``one_two_five(1024)`` is ``[1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]``.
    """
    bounds, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > maximum:
                return bounds
            bounds.append(mantissa * scale)
        scale *= 10


def metric_value(text: str, name: str, labels: str = "") -> float:
    """One sample's value from Prometheus text (what /metrics serves); 0.0 when absent.

    Example: ``metric_value(text, "neuronpack_requests_total", 'finish_reason="abort"')``.
    """
    wanted = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key == wanted:
            return float(value)
    return 0.0
