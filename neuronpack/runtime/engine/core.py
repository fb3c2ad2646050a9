"""The engine: continuous batching over a compiled model's KV rows.

One loop (a background thread when serving, the caller's thread for ``generate``) repeats a step: take submitted /
aborted requests from a thread-safe inbox, then twice schedule / execute / update (vLLM v1's split): the scheduler
(scheduler.py) plans this step's prompt chunks (``StepPlan``, plan.py), the runner (runner.py) runs them on the
model (sharing one call), the engine samples the first tokens of the prompts whose last chunk ran; then the
scheduler plans one decode step over the decoding sequences only (the compiled graph runs at the batch of decoding
sequences, so one request alone costs a batch-1 step), the runner runs it and the engine samples one token per
sequence. Chunked prefill interleaved with decoding (vLLM's ``--max-num-batched-tokens``): while streams decode, a
step runs at most ``EngineLimits.max_num_batched_tokens`` token positions (unset: as many as keep a stream's gap
near 2.5 decode steps by the measured timings, step_budget.py), the decode step's tokens first and the prompts'
chunks (prompts x the longest chunk) in what is left, so a long prompt is prefilled over several steps and never
stalls the streams for more than one step; with nothing decoding a step takes one chunk of the largest
context bucket (or the budget, if larger). A prompt whose last chunk ran in a step decodes from the next one. Which
sequence holds which KV row is the scheduler's ``RowAllocator`` (kv_rows.py) alone; the plans carry the row moves
the model's cache (and an EAGLE draft's) apply.

Prefix caching (``PrefixCaching``, prefix_cache.py; on unless turned off, vLLM's automatic prefix caching): a row
a sequence gave back keeps its KV while other rows are free, a prompt takes the free row holding its longest prefix
(topped up from the block pool beyond the batch, kv_blocks.py) and is prefilled from the first uncached position
(``PrefillGroup.start``); ``/metrics`` counts the prompt tokens looked up and found, and every ``StepOutput``
carries the request's ``num_cached_tokens``. A prompt asking for prompt logprobs is prefilled whole (its every
position's logits are needed); an EAGLE artifact does not reuse prefixes (its draft model's KV of a prompt is built
from the target's hidden states of that prompt, which a cache hit does not compute).

Limits are checked when a request is submitted (``requests.check_request``: HTTP 400 before anything streams;
``max_tokens`` is clamped to what fits, like vLLM). ``max_tokens`` 0 scores the prompt only (prompt logprobs).
Parallel sampling: ``submit_forks`` queues several requests for one prompt (n > 1); the prompt is prefilled once and
its KV copied into the other members' rows (the plan's ``fork_copies``), then each samples with its own generator.
Prompt logprobs (echo): ``CompiledModel.prompt_logits`` prefills the prompt and returns logits at every position.
``EngineLimits`` bounds the load (``admission.py``: at most ``batch_size + max_waiting`` in flight, else HTTP 503);
a request older than ``request_timeout`` ends with finish_reason "timeout", its row freed before the next model
call. ``drain()`` refuses new requests and ``abort_all()`` ends every one in flight (graceful shutdown).

Constrained decoding (a request's ``grammar`` from ``engine.grammars.compile(spec)``): a row's logits are masked to
the tokens its grammar allows before sampling (prefill, decode and each verified position of a speculative draft,
first cut at its first refused token); it ends "stop" once its grammar is complete, "length" at max_tokens or if the
grammar reaches a dead end.

Speculative decoding (an artifact compiled with ``[speculation]``): the decode step becomes a draft-then-verify step
(``speculation/step.py``) that may emit several tokens per sequence; they go through the stop rules one by
one (whatever follows a stop is dropped), and sequences end with "length" once ``length + lookahead`` would pass
``max_model_len``.

Example::

    engine = Engine(load_artifact(artifact_dir), ArtifactTokenizer.from_dir(artifact_dir))
    result = engine.generate(GenerationRequest(prompt_ids=tuple(tok.encode("Hello")), max_tokens=16))
    result.text, result.finish_reason
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from neuronpack.errors import InvalidRequestError
from neuronpack.runtime.engine.admission import Admission
from neuronpack.runtime.engine.logprobs import TokenLogprobs, prompt_logprobs
from neuronpack.runtime.engine.metrics import EngineMetrics
from neuronpack.runtime.engine.plan import StepPlan
from neuronpack.runtime.engine.prefix_cache import PrefixCaching
from neuronpack.runtime.engine.requests import (
    CompiledModel,
    EngineLimits,
    EngineSummary,
    GenerationRequest,
    GenerationResult,
    RequestState,
    StepOutput,
    check_request,
    new_request_state,
    run_to_completion,
    step_token_budget,
)
from neuronpack.runtime.engine.runner import ModelRunner
from neuronpack.runtime.engine.sampling import DEFAULT_GLOBAL_TOPK, sample
from neuronpack.runtime.engine.scheduler import SlotScheduler
from neuronpack.runtime.engine.speculation.acceptance import Accepted
from neuronpack.runtime.engine.speculation.config import SpeculationConfig
from neuronpack.runtime.engine.speculation.step import SpecRow, SpeculativeStep
from neuronpack.runtime.engine.step_budget import StepBudget
from neuronpack.runtime.engine.stopping import FinishReason
from neuronpack.runtime.structured import GrammarCompiler, Masks, mask_logits

if TYPE_CHECKING:
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

class Engine:
    """Continuous-batching scheduler + sampler around one compiled model. Thread-safe: ``submit`` and ``abort``
    may be called from any thread; everything else runs on the engine loop."""

    def __init__(
        self,
        model: CompiledModel,
        tokenizer: ArtifactTokenizer,
        *,
        max_model_len: int | None = None,
        global_topk: int = DEFAULT_GLOBAL_TOPK,
        lookahead: int = 0,
        metrics: EngineMetrics | None = None,
        limits: EngineLimits | None = None,
        speculation: SpeculationConfig | None = None,
        prefix_caching: PrefixCaching | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_model_len = min(max_model_len or model.max_seq_len, model.max_seq_len)
        # Longer prompts than one call takes (the largest context bucket) are prefilled in chunks.
        self.max_prompt_len = self.max_model_len - 1
        self.global_topk = global_topk
        self.speculation = speculation
        self.speculator = (SpeculativeStep(model, speculation.proposer(model), speculation.length) if speculation
                           else None)
        # Speculating, a sequence must leave room for a whole verify call: it ends "length + lookahead" early.
        self.lookahead = max(lookahead, speculation.length if speculation else 0)
        self.eos_token_ids = frozenset({*model.eos_token_ids, tokenizer.eos_token_id} - {None})
        self.adapter_names: tuple[str, ...] = tuple(getattr(model, "adapter_names", ()))
        self.metrics = metrics or EngineMetrics(model.batch_size, speculation.length if speculation else 0,
                                                self.max_model_len)
        self.runner = ModelRunner(model, self.speculator)
        self.prefix_caching = prefix_caching if prefix_caching is not None else PrefixCaching()
        self.prefix_caching_off_reason, cache_blocks = self.prefix_caching.blocks_for(model, self.runner.proposer)
        if cache_blocks:
            model.reserve_blocks(cache_blocks, self.prefix_caching.block_size)  # the pool that keeps prefixes
        self.scheduler: SlotScheduler[RequestState] = SlotScheduler(
            model.batch_size, speculation.length if speculation else 0, cache_blocks,
            None if self.prefix_caching_off_reason else self.prefix_caching.block_size, max_chunk=self.runner.chunk,
            window=getattr(model, "kv_window", None))
        self._block_bytes = self.prefix_caching.block_bytes(getattr(model, "kv_token_bytes", 0))
        if not self.prefix_caching_off_reason:  # what the pool holds at most: the budget in whole blocks
            self.metrics.prefix_cache_budget.set(cache_blocks * self._block_bytes)
        model.kv_user = self  # the KV cache is the model's: an engine that sees another user here forgets its prefixes
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # torch threads of the background loop, set on its own thread when it starts (None: as the process has it).
        # libgomp keeps a pool of workers per thread that opens a parallel region; once two threads have one (the
        # loading thread's and the loop's), more workers exist than cores on a small machine, libgomp spins only
        # briefly between regions and every region wakes sleeping workers: 3x slower decode on 2 cores. A server
        # loads on one thread (no pool) and gives the loop its threads here.
        self.loop_threads: int | None = None
        self.limits = limits or EngineLimits()
        self.step_budget = StepBudget(step_token_budget(self.limits.max_num_batched_tokens, model.batch_size,
                                                        speculation.length if speculation else 0), self.runner.chunk)
        self.admission = Admission(model.batch_size, self.limits.max_waiting, self.metrics)
        self.grammars = GrammarCompiler(tokenizer.to_json_str, vocab_size=model.vocab_size,
                                        eos_token_ids=sorted(self.eos_token_ids))

    # ---- requests (any thread) -------------------------------------------------------------------------------
    def check(self, request: GenerationRequest) -> int:
        """Validate a request against the compiled limits; return its effective max_tokens (``check_request``)."""
        return check_request(request, max_prompt_len=self.max_prompt_len, max_model_len=self.max_model_len,
                             vocab_size=self.model.vocab_size, adapters=len(self.adapter_names))

    def submit(self, request: GenerationRequest, sink: Callable[[StepOutput], None]) -> str:
        """Queue a request; ``sink`` gets each StepOutput on the engine thread. Returns the request id.

        ServerBusyError when the engine is full (``batch_size + max_waiting`` in flight) or draining."""
        return self.submit_forks([request], [sink])[0]

    def submit_forks(self, requests: Sequence[GenerationRequest], sinks: Sequence[Callable[[StepOutput], None]]
                     ) -> list[str]:
        """Queue requests that share one prompt (parallel sampling, n > 1): the prompt is prefilled once and its KV
        copied to the others' slots. At most ``batch_size`` of them (they run side by side). Returns their ids."""
        if not requests or len(requests) != len(sinks):
            raise ValueError(f"{len(requests)} requests but {len(sinks)} sinks")
        if len(requests) > self.model.batch_size:
            raise InvalidRequestError(f"{len(requests)} parallel samples of one prompt do not fit the batch of "
                                      f"{self.model.batch_size} this artifact was compiled for", param="n")
        if len({(r.prompt_ids, r.prompt_logprobs, r.adapter) for r in requests}) != 1:
            raise ValueError("forked requests must share their prompt, prompt_logprobs and adapter")
        seqs = [self._sequence(r, sink) for r, sink in zip(requests, sinks, strict=True)]
        seqs[0].forks = seqs[1:]
        self.admission.admit(len(seqs))
        self._inbox.put(("add", seqs[0]))
        self._wake.set()
        return [r.request_id for r in requests]

    def _sequence(self, request: GenerationRequest, sink: Callable[[StepOutput], None]) -> RequestState:
        return new_request_state(request, sink, self.check(request), eos_token_ids=self.eos_token_ids,
                                 max_model_len=self.max_model_len, lookahead=self.lookahead, tokenizer=self.tokenizer,
                                 global_topk=self.global_topk, vocab_size=self.model.vocab_size,
                                 spec_length=self.speculation.length if self.speculation else None)

    def abort(self, request_id: str) -> None:
        """Stop a request (client gone); its slot is freed before the next model call."""
        self._inbox.put(("abort", request_id))
        self._wake.set()

    def drain(self) -> None:
        """Refuse new requests from now on (ServerBusyError); those in flight go on."""
        self.admission.drain()

    def abort_all(self) -> None:
        """End every request in flight with "abort" (graceful shutdown once its grace period is over)."""
        self._inbox.put(("abort_all", None))
        self._wake.set()

    def summary(self) -> EngineSummary:
        """What serving reports once loaded: batch, lengths, the loop's threads, the prefix cache's rows."""
        return EngineSummary(self.model.batch_size, self.max_model_len, self.max_prompt_len, self.loop_threads,
                             self.scheduler.rows.cache_blocks, self.prefix_caching.block_size, self._block_bytes,
                             self.prefix_caching.memory_mib, self.prefix_caching_off_reason,
                             self.step_budget.fixed)

    @property
    def in_flight(self) -> int:
        """Requests submitted and not finished yet."""
        return self.admission.in_flight

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Run one request to completion (on this thread unless the background loop is running)."""
        return run_to_completion(request, self.submit, None if self._thread is not None else self.step)

    # ---- the loop ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Run the loop on a background thread (idempotent)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="neuronpack-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the background loop; requests still in flight end with finish_reason "abort"."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        for seq in self.scheduler.all_sequences():
            self._finish_without_token(seq, FinishReason.ABORT)

    def step(self) -> bool:
        """One iteration: inbox, a prefill plan, a decode plan (each scheduled, run, applied). Returns False when
        there was nothing to do."""
        self._drain_inbox()
        self._expire()
        sched = self.scheduler
        if getattr(self.model, "kv_user", self) is not self:  # another engine wrote (or reallocated) this KV cache
            sched.rows.forget_cached()
            if sched.rows.cache_blocks:  # its pool may have been replaced (another block size): ours again
                self.model.reserve_blocks(sched.rows.cache_blocks, self.prefix_caching.block_size)
        self.model.kv_user = self
        if sched.idle:
            self._update_load()
            return False
        # Prompts' chunks within what the step's token budget leaves after the decode step's tokens.
        decode_tokens = len(sched.decoding) * (1 + (self.speculation.length if self.speculation else 0))
        plan = sched.schedule_prefills(token_budget=sched.prefill_budget(self.step_budget.step_tokens(decode_tokens)))
        self.runner.move_rows(plan.moves)
        # A prompt whose last chunk runs in this step (and its forks) decodes from the next one: the step's token
        # budget did not count it.
        fresh = {sched.at(row).request_id for g in plan.prefills if g.done for row in g.rows}
        if plan.prefills:
            self._prefill(plan)
        # Planned after the prefills' first tokens: a sequence may end there and free its row.
        plan = sched.schedule_decode(skip=fresh)
        self.runner.move_rows(plan.moves)
        if plan.decodes:
            self._decode(plan)
        self._update_load()
        return True

    def _run(self) -> None:
        if self.loop_threads:
            import torch

            torch.set_num_threads(self.loop_threads)
        while not self._stop.is_set():
            try:
                busy = self.step()
            except Exception as exc:  # a bug or a model failure outside a request: fail everyone, keep serving
                self._fail(self.scheduler.all_sequences(), "", exc)
                busy = False
            if not busy:
                self._wake.wait(timeout=0.5)
                self._wake.clear()

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self.scheduler.add(payload)
            elif kind == "abort":
                seq = self.scheduler.remove(payload)
                if seq is not None:
                    self._finish_without_token(seq, FinishReason.ABORT)
            elif kind == "abort_all":
                for seq in self.scheduler.all_sequences():
                    self._finish_without_token(seq, FinishReason.ABORT)

    def _expire(self) -> None:
        timeout = self.limits.request_timeout
        if timeout is None:
            return
        now = time.monotonic()
        for seq in self.scheduler.all_sequences():
            if now - seq.arrival > timeout:
                self._finish_without_token(seq, FinishReason.TIMEOUT,
                                           error=f"the request took longer than the server's {timeout:g} s limit")

    # ---- applying a plan's outputs -----------------------------------------------------------------------------
    def _prefill(self, plan: StepPlan) -> None:
        """Run the plan's prefills, then sample each group's first token per member (or score its prompt)."""
        members = {g.request_id: [self.scheduler.at(row) for row in g.rows] for g in plan.prefills}
        started = time.monotonic()
        outputs = self.runner.prefill(plan.prefills)
        self.step_budget.observe_prefill(time.monotonic() - started,
                                         len(plan.prefills) * max(len(g.tokens) for g in plan.prefills))
        for group in plan.prefills:
            seqs, out = members[group.request_id], outputs[group.request_id]
            if out.error is None and not out.done:
                continue  # more chunks to come in later steps
            started = time.monotonic()
            try:
                if out.error is not None:
                    raise out.error
                leader = seqs[0]
                prompt_lp = (prompt_logprobs(out.all_logits, leader.prompt_ids, leader.prompt_logprobs)
                             if out.all_logits is not None else None)
                if not group.scoring_only:
                    rows = mask_logits(out.logits.expand(len(seqs), -1), [m.constraint for m in seqs])
                    tokens, entries = sample(rows, [m.sampler for m in seqs])
            except Exception as exc:
                self._fail(seqs, "prefill failed: ", exc)
                continue
            self.metrics.prefill_seconds.observe(out.seconds + time.monotonic() - started)
            self.metrics.prompt_tokens.inc(len(group.prompt_ids))
            if group.cache_query:
                self.metrics.observe_prefix_cache(len(group.prompt_ids), seqs[0].num_cached_tokens)
            for i, member in enumerate(seqs):
                member.prefilled = i == 0 or not group.scoring_only  # a scoring-only group copies nothing
                if i and member.prefilled:  # a fork's prompt KV is copied from the first's row: none of it computed
                    member.num_cached_tokens = len(group.prompt_ids)
                if group.scoring_only:
                    self._finish_without_token(member, FinishReason.LENGTH, prompt_logprobs=prompt_lp)
                else:
                    self._emit(member, [int(tokens[i])], None if entries[i] is None else [entries[i]], prompt_lp)

    def _decode(self, plan: StepPlan) -> None:
        """One decode step over the running sequences: one token each, or with speculation a draft-then-verify step
        that may emit several."""
        running = [self.scheduler.at(d.row) for d in plan.decodes]
        started = time.monotonic()
        try:
            outcomes = (self._speculate(plan, running) if self.speculator is not None
                        else self._decode_one(plan, running))
        except Exception as exc:
            self._fail(running, "decode failed: ", exc)
            return
        seconds = time.monotonic() - started
        self.metrics.decode_seconds.observe(seconds)
        self.step_budget.observe_decode(seconds)
        self.metrics.step_occupancy.observe(len(running) / self.scheduler.batch_size)
        for seq, outcome in zip(running, outcomes, strict=True):
            self._emit(seq, outcome.token_ids, outcome.logprobs, drafted=outcome if self.speculator else None,
                       batch=len(running))

    def _decode_one(self, plan: StepPlan, running: list[RequestState]) -> list[Accepted]:
        masks = Masks.start([s.constraint for s in running])  # grammar masks computed while the model runs
        logits = self.runner.decode(plan.decodes)  # [n_running, vocab]
        next_tokens, entries = sample(masks.apply(logits), [s.sampler for s in running])
        return [Accepted([token], 0, 0, None if entry is None else [entry])
                for token, entry in zip(next_tokens.tolist(), entries, strict=True)]

    def _speculate(self, plan: StepPlan, running: list[RequestState]) -> list[Accepted]:
        rows = [SpecRow(d.request_id, d.row, d.position, [*s.prompt_ids, *s.output.token_ids], d.num_draft,
                        s.sampler, s.constraint) for d, s in zip(plan.decodes, running, strict=True)]
        outcomes, stats = self.runner.speculate(rows)
        self.metrics.observe_speculation(stats)
        return outcomes

    def _emit(self, seq: RequestState, tokens: list[int], logprobs: list[TokenLogprobs] | None = None,
              prompt_lp: list[TokenLogprobs | None] | None = None, drafted: Accepted | None = None,
              batch: int | None = None) -> None:
        """Append ``tokens`` one by one through the stop rules (those after a stop are dropped) and deliver them as
        one StepOutput."""
        now = time.monotonic()
        if seq.first_token_at is None:
            seq.first_token_at = now
            self.metrics.observe_first_token(now - seq.arrival)
        else:
            self.metrics.itl.observe(now - (seq.last_token_at or now))
        seq.last_token_at = now
        text, kept, finish_reason = seq.take(tokens)
        self.metrics.generation_tokens.inc(kept)
        if drafted is not None and seq.spec is not None:
            seq.spec.observe(drafted.num_draft, drafted.num_accepted, kept)
        finished = finish_reason is not None
        out = StepOutput(seq.request_id, tokens[:kept], text, finish_reason, len(seq.prompt_ids),
                         len(seq.output.token_ids), logprobs=logprobs[:kept] if logprobs is not None else None,
                         prompt_logprobs=prompt_lp, stop_reason=seq.output.stop_reason,
                         num_cached_tokens=seq.num_cached_tokens, batch=batch,
                         speculation=seq.spec.to_dict() if finished and seq.spec is not None else None)
        if finished:
            self.scheduler.release(seq)
            self.metrics.observe_finish(finish_reason, now - seq.arrival, len(seq.prompt_ids), out.completion_tokens)
            self.admission.retire()
        self._deliver(seq, out)

    def _fail(self, seqs: Sequence[RequestState], what: str, exc: Exception) -> None:
        for seq in seqs:
            self._finish_without_token(seq, FinishReason.ERROR, error=f"{what}{type(exc).__name__}: {exc}")

    def _finish_without_token(self, seq: RequestState, reason: FinishReason, error: str | None = None,
                              prompt_logprobs: list[TokenLogprobs | None] | None = None) -> None:
        self.scheduler.discard(seq, keep=reason is not FinishReason.ERROR)
        self.runner.forget(seq.request_id)
        self.metrics.observe_finish(reason, time.monotonic() - seq.arrival, len(seq.prompt_ids),
                                    len(seq.output.token_ids))
        self.admission.retire()
        out = StepOutput(seq.request_id, [], "", reason, len(seq.prompt_ids), len(seq.output.token_ids), error,
                         prompt_logprobs=prompt_logprobs, num_cached_tokens=seq.num_cached_tokens,
                         speculation=seq.spec.to_dict() if seq.spec is not None else None)
        self._deliver(seq, out)

    def _deliver(self, seq: RequestState, out: StepOutput) -> None:
        try:
            seq.sink(out)
        except Exception:  # the consumer is gone (closed event loop): stop generating for it
            if out.finish_reason is None and self.scheduler.remove(seq.request_id) is not None:
                self.metrics.observe_finish(FinishReason.ABORT, time.monotonic() - seq.arrival, out.prompt_tokens,
                                            out.completion_tokens)
                self.admission.retire()

    def _update_load(self) -> None:
        self.metrics.set_load(len(self.scheduler.waiting), len(self.scheduler.running))
        self.metrics.prefix_cache_usage.set(self.scheduler.rows.cache_blocks_in_use * self._block_bytes)
