"""What goes into and comes out of the engine: requests, their per-step outputs and final results, the engine's
view of a request, the load limits, the model protocol it drives, and request validation (``check_request``: HTTP
400 before anything streams).

Example::

    max_tokens = check_request(GenerationRequest(prompt_ids=(1, 2, 3), max_tokens=50), max_prompt_len=64,
                               max_model_len=128, vocab_size=384)      # 50
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from neuronpack.errors import InvalidRequestError, ServeError
from neuronpack.runtime.engine.logprobs import MAX_LOGPROBS, TokenLogprobs
from neuronpack.runtime.engine.prefix_cache import USEFUL_BLOCKS
from neuronpack.runtime.engine.sampling import RowSampler, SamplingParams
from neuronpack.runtime.engine.speculation.stats import SpecStats
from neuronpack.runtime.engine.step_budget import GAP_STEPS
from neuronpack.runtime.engine.stopping import Decoder, FinishReason, IncrementalDetokenizer, SequenceOutput, StopRules
from neuronpack.runtime.structured import CompiledGrammar, Constraint

if TYPE_CHECKING:
    from torch import Tensor

SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts


@dataclass(frozen=True)
class EngineLimits:
    """Load limits. ``max_waiting``: requests that may wait for a slot beyond the batch (None: unbounded);
    ``request_timeout``: seconds from submission until a request is ended with "timeout" (None: never);
    ``max_num_batched_tokens``: token positions one engine step may run while streams decode (vLLM's
    ``--max-num-batched-tokens``): the decode step's tokens first, the prompts' chunks in what is left (None: a
    budget that follows the measured step times, step_budget.py)."""

    max_waiting: int | None = None
    request_timeout: float | None = None
    max_num_batched_tokens: int | None = None


@dataclass(frozen=True)
class EngineSummary:
    """What a server says about its engine once loaded (``Engine.summary()``): the compiled batch, the lengths, the
    loop's torch threads (None: as the process has them), the prefix cache (its pool of blocks beyond the batch,
    the bytes of one block, the budget asked for; or why it is off) and the step's token budget."""

    batch_size: int
    max_model_len: int
    max_prompt_len: int
    threads: int | None
    cache_blocks: int
    block_size: int
    block_bytes: int
    cache_budget_mib: float
    prefix_caching_off: str | None  # None: prefix caching is on
    max_num_batched_tokens: int | None  # None: automatic (step_budget.py)

    @property
    def cache_mib(self) -> float:
        """MiB of the block pool kept for cached prefixes beyond the batch."""
        return self.cache_blocks * self.block_bytes / 2**20

    def prefix_cache_line(self) -> str:
        """What ``serve`` says at start about the prefix cache: its pool, or that the budget buys nothing useful."""
        if self.prefix_caching_off is not None:
            return f"prefix caching off: {self.prefix_caching_off}"
        if self.cache_blocks < USEFUL_BLOCKS:
            useful = USEFUL_BLOCKS * self.block_bytes / 2**20
            return (f"prefix caching: --prefix-cache-memory {self.cache_budget_mib:g} MiB holds {self.cache_blocks} "
                    f"blocks of {self.block_size} tokens ({self.block_bytes / 2**20:.3f} MiB each), too few to keep a "
                    f"useful prefix: only the batch's free rows keep prefixes (give it {useful:.2f} MiB or more)")
        return (f"prefix caching: {self.cache_blocks} blocks of {self.block_size} tokens "
                f"({self.cache_blocks * self.block_size} tokens, {self.cache_mib:.1f} MiB) beyond the batch, whose "
                f"free rows keep prefixes too")

    def chunked_prefill_line(self) -> str:
        """What ``serve`` says at start about the step budget."""
        if self.max_num_batched_tokens is not None:
            return (f"chunked prefill: {self.max_num_batched_tokens} tokens a step while streams decode "
                    "(--max-num-batched-tokens)")
        return (f"chunked prefill: while streams decode, a step prefills what takes about {GAP_STEPS - 1:g} decode "
                "steps, measured (--max-num-batched-tokens N fixes the step's tokens)")


class CompiledModel(Protocol):
    """What the runner drives (``neuronpack.backends.torch_aot.CompiledLM``). A slot is a KV-cache row: which
    sequence holds which is the engine's ``RowAllocator`` (kv_rows.py); a decode or verify step runs on one window
    of adjacent rows (any order), which the allocator keeps packed with the moves it hands to ``move_kv`` (a model
    without it gets only ``copy_rows``' copies). With ``reserve_blocks`` / ``kv_token_bytes``, a pool of KV blocks
    beyond the rows keeps cached prefixes."""

    batch_size: int
    context_buckets: tuple[int, ...]
    token_generation_buckets: tuple[int, ...]
    max_seq_len: int
    max_verify_tokens: int  # tokens per row a verify call takes (1 without speculation compiled in)
    vocab_size: int
    eos_token_ids: tuple[int, ...]

    adapter_names: tuple[str, ...]  # LoRA adapters (index k is adapter_names[k - 1]); models without: ()

    def prefill(self, slots: Sequence[int], prompts: Sequence[Sequence[int]],
                adapters: Sequence[int] | None = None) -> Tensor:
        """Write each prompt's KV into its row. Returns float32 logits [len(slots), vocab] of each prompt's last
        token."""
        ...

    def prefill_hidden(self, slots: Sequence[int], prompts: Sequence[Sequence[int]],
                       hidden_layers: Sequence[int] | None = None) -> tuple[Tensor, Tensor]:
        """``prefill`` that also returns (logits, hidden): hidden [len(slots), longest prompt, hidden size], the
        final-normed states, or with ``hidden_layers`` the inputs of those layers concatenated (what EAGLE reads)."""
        ...

    def decode(self, tokens: Tensor, positions: Tensor, slots: Sequence[int] | None = None,
               adapters: Sequence[int] | None = None) -> Tensor:
        """One step per row; returns float32 logits [len(slots), vocab] in the order of ``slots``."""
        ...

    def verify(self, slots: Sequence[int], token_rows: Sequence[Sequence[int]], starts: Sequence[int],
               adapters: Sequence[int] | None = None) -> Tensor:
        """T tokens per row in one step (speculative verification), row i at positions ``starts[i]..+T-1``.
        Returns float32 logits [n, T, vocab]."""
        ...

    def verify_hidden(self, slots: Sequence[int], token_rows: Sequence[Sequence[int]], starts: Sequence[int],
                      hidden_layers: Sequence[int] | None = None) -> tuple[Tensor, Tensor]:
        """``verify`` that also returns (logits, hidden): hidden [n, T, hidden size] (or ``hidden_layers``' inputs
        concatenated, as ``prefill_hidden``)."""
        ...

    def copy_rows(self, copies: Sequence[tuple[int, int, int]]) -> None:
        """Apply ``(src, dst, length)`` copies in order: cache positions 0..length-1 of row src into row dst."""
        ...

    def move_kv(self, moves: Sequence[Any]) -> None:
        """Apply the allocator's moves in order (kv_rows.py): ``RowCopy``, ``RowSwap``, ``BlockCopy``,
        ``BlockExchange``."""
        ...

    def prompt_logits(self, token_ids: Sequence[int], slot: int = 0, adapter: int = 0) -> Tensor:
        """Like ``prefill`` of one prompt into row ``slot``, but float32 logits [len, vocab] of every position."""
        ...


@dataclass(frozen=True)
class GenerationRequest:
    """One completion to generate. ``max_tokens`` None means "up to the model length", 0 "score the prompt only".
    ``prompt_logprobs``: top-N for the prompt tokens' logprobs (the first output carries them), None for none."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams = SamplingParams()
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    prompt_logprobs: int | None = None
    request_id: str = field(default_factory=lambda: f"req-{uuid.uuid4().hex}")
    adapter: int = 0  # LoRA adapter: 0 the base model, k the artifact's k-th adapter (runtime/adapters.py: by name)
    grammar: CompiledGrammar | None = None  # constrained decoding: the output must match it (Engine.grammars)


@dataclass
class GenerationResult:
    """A finished request, as ``Engine.generate`` returns it (times in seconds)."""

    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    timings: dict[str, float]
    speculation: dict[str, Any] | None = None  # SpecStats.to_dict() when the engine speculated


@dataclass
class StepOutput:
    """What one request gets after a step: the new token(s) and text, and the finish reason once it ends."""

    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None  # set when the model failed; finish_reason is then ERROR
    logprobs: list[TokenLogprobs] | None = None  # one per token in token_ids, when the request asked for them
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # on the first output only, when asked for
    stop_reason: str | int | None = None  # the stop string / stop token id that ended the request
    speculation: dict[str, Any] | None = None  # on the last output of a speculating engine: SpecStats.to_dict()
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (vLLM's RequestOutput field)
    batch: int | None = None  # sequences of the decode step that produced this output (None: not a decode step)


@dataclass(eq=False)
class RequestState:
    """One request inside the engine (what the scheduler queues and gives a KV row: the scheduler's
    ``RowAllocator`` knows which). ``sink`` receives every StepOutput (called on the engine thread)."""

    request_id: str
    prompt_ids: list[int]
    sampler: RowSampler
    output: SequenceOutput
    sink: Callable[[StepOutput], None]
    arrival: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    last_token_at: float | None = None
    prompt_logprobs: int | None = None  # top-N for prompt logprobs (echo), None when not asked for
    forks: list[RequestState] = field(default_factory=list)  # n > 1: same prompt, prefilled once with this one
    adapter: int = 0  # LoRA adapter index (0: none)
    spec: SpecStats | None = None  # this request's speculation counts (speculating engines only)
    constraint: Constraint | None = None  # the request's grammar state (constrained decoding only)
    prefilled: bool = False  # its row holds its prompt's KV (set once its prefill succeeded)
    num_cached_tokens: int = 0  # prompt tokens whose KV the prefix cache supplied (set when it gets its row)

    def take(self, tokens: Sequence[int]) -> tuple[str, int, FinishReason | None]:
        """Append emitted ``tokens`` one by one through the grammar and the stop rules, up to the first that ends the
        sequence (the rest are dropped). Returns (the streamable text, how many were kept, the finish reason)."""
        text, kept, reason = [], 0, None
        for token in tokens:
            if self.constraint is not None and not self.constraint.consume(token):  # a dead end: nothing fits
                delta = self.output.end(FinishReason.LENGTH)
            else:
                delta = self.output.append(token, complete=self.constraint is not None and self.constraint.done)
                kept += 1
            text.append(delta.text)
            if (reason := delta.finish_reason) is not None:
                break
        return "".join(text), kept, reason

    @property
    def last_token(self) -> int:
        return self.output.token_ids[-1]

    @property
    def next_position(self) -> int:
        # The last sampled token is not in the cache yet: it goes at position total_len - 1.
        return self.output.total_len - 1

    @property
    def cached_tokens(self) -> list[int]:
        """The tokens whose KV its row holds (what prefix caching keeps when it ends): the prompt, and the sampled
        tokens but the last; nothing before its prefill succeeded."""
        if not self.prefilled:
            return []
        tokens = self.output.token_ids
        return [*self.prompt_ids, *tokens[:-1]] if tokens else list(self.prompt_ids)

    @property
    def room(self) -> int:
        """Tokens the sequence may still emit (max_tokens and the model length)."""
        out = self.output
        return min(out.rules.max_tokens - len(out.token_ids), out.rules.max_model_len - out.total_len)

    @property
    def scoring_only(self) -> bool:
        """max_tokens 0: the prompt is scored (prompt logprobs), nothing is generated."""
        return self.output.rules.max_tokens == 0


def step_token_budget(requested: int | None, batch_size: int, spec_length: int = 0) -> int | None:
    """A fixed step budget (``EngineLimits.max_num_batched_tokens``) checked: at least one prompt token beyond a full
    batch's decode step (one token per row, k + 1 speculating), or a ServeError saying so. None stays None (the
    budget follows the measured step times)."""
    decode = batch_size * (1 + spec_length)
    if requested is not None and requested <= decode:
        raise ServeError(f"a step budget of {requested} tokens leaves no token for prompts once a full batch decodes "
                         f"({decode} tokens a step)", where="--max-num-batched-tokens",
                         fix=f"pass more than {decode}, or leave it out (automatic)")
    return requested


def check_request(request: GenerationRequest, *, max_prompt_len: int, max_model_len: int, vocab_size: int,
                  adapters: int = 0) -> int:
    """Validate a request against an artifact's compiled limits; return its effective max_tokens.

    The prompt must leave room for one token below ``max_model_len`` (``max_prompt_len``: a tighter bound, if any;
    the engine takes up to ``max_model_len - 1``, prefilling what one call does not take in chunks);
    ``max_tokens`` is clamped to what fits (``max_model_len - prompt``), like vLLM does when it is omitted, and the
    sequence ends with "length" there. Raises InvalidRequestError (HTTP 400) naming the limits.
    Example: with max_model_len 128 a 100-token prompt asking for 50 tokens gets 28.
    """
    n = len(request.prompt_ids)
    if n == 0:
        raise InvalidRequestError("the prompt is empty", param="prompt", fix="Send at least one token")
    if n >= max_model_len:
        raise InvalidRequestError(
            f"the prompt has {n} tokens, leaving no room to generate below the maximum model length "
            f"{max_model_len} (prompt + completion)",
            param="prompt",
            fix="Shorten the prompt or recompile with a larger target.seq_len",
        )
    if n > max_prompt_len:
        raise InvalidRequestError(f"the prompt has {n} tokens, more than the {max_prompt_len} this server takes "
                                  f"(max model length {max_model_len})", param="prompt", fix="Shorten the prompt")
    bad = [t for t in request.prompt_ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(
            f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})", param="prompt"
        )
    _check_sampling(request.sampling)
    if not 0 <= request.adapter <= adapters:
        raise InvalidRequestError(f"LoRA adapter {request.adapter} does not exist (this model has "
                                  f"{adapters})", param="model")
    for name, value in (("logprobs", request.sampling.logprobs), ("prompt_logprobs", request.prompt_logprobs)):
        if value is not None and not 0 <= value <= MAX_LOGPROBS:
            raise InvalidRequestError(f"{name} must be between 0 and {MAX_LOGPROBS}, got {value}", param=name)
    room = max_model_len - n
    if request.max_tokens is None:
        return room
    if request.max_tokens < 0:
        raise InvalidRequestError(f"max_tokens must be at least 0, got {request.max_tokens}", param="max_tokens")
    return min(request.max_tokens, room)


def _check_sampling(params: SamplingParams) -> None:
    if params.temperature < 0:
        raise InvalidRequestError(f"temperature must be >= 0, got {params.temperature}", param="temperature")
    if not 0.0 < params.top_p <= 1.0:
        raise InvalidRequestError(f"top_p must be in (0, 1], got {params.top_p}", param="top_p")
    if params.seed is not None and not SEED_RANGE[0] <= params.seed <= SEED_RANGE[1]:
        raise InvalidRequestError(f"seed must be in [{SEED_RANGE[0]}, {SEED_RANGE[1]}], got {params.seed}",
                                  param="seed")


def run_to_completion(request: GenerationRequest, submit: Callable[[GenerationRequest, Callable], Any],
                      step: Callable[[], Any] | None) -> GenerationResult:
    """Submit ``request`` and wait for its result, stepping the engine with ``step`` (None: a loop runs it)."""
    outputs: list[StepOutput] = []
    first_at: list[float] = []
    done = threading.Event()

    def sink(out: StepOutput) -> None:
        outputs.append(out)
        if len(outputs) == 1:
            first_at.append(time.monotonic())
        if out.finish_reason is not None:
            done.set()

    started = time.monotonic()
    submit(request, sink)
    while step is not None and not done.is_set():
        step()
    done.wait()
    return generation_result(outputs, started, first_at[0] if first_at else started)


def generation_result(outputs: list[StepOutput], started: float, first_at: float) -> GenerationResult:
    """The GenerationResult of one finished request from its StepOutputs (ServeError when it failed)."""
    last = outputs[-1]
    if last.finish_reason is FinishReason.ERROR:
        raise ServeError(f"generation failed: {last.error}", fix="run with NEURONPACK_DEBUG=1 and report the error")
    token_ids = [t for o in outputs for t in o.token_ids]
    total = time.monotonic() - started
    return GenerationResult(
        text="".join(o.text for o in outputs),
        token_ids=token_ids,
        finish_reason=last.finish_reason or FinishReason.ERROR,
        prompt_tokens=last.prompt_tokens,
        completion_tokens=last.completion_tokens,
        speculation=last.speculation,
        timings={
            "ttft_s": first_at - started,
            "total_s": total,
            "tokens_per_s": len(token_ids) / total if total > 0 else 0.0,
        },
    )


def new_request_state(request: GenerationRequest, sink: Callable[[StepOutput], None], max_tokens: int, *,
                      eos_token_ids: frozenset[int], max_model_len: int, lookahead: int, tokenizer: Decoder,
                      global_topk: int, vocab_size: int, spec_length: int | None) -> RequestState:
    """The engine's state for a checked request (``max_tokens`` from ``check_request``)."""
    rules = StopRules(
        eos_token_ids=eos_token_ids,
        max_tokens=max_tokens,
        max_model_len=max_model_len,
        stop=tuple(s for s in request.stop if s),
        stop_token_ids=frozenset(request.stop_token_ids),
        ignore_eos=request.ignore_eos,
        include_stop_str_in_output=request.include_stop_str_in_output,
        lookahead=lookahead,
    )
    prompt = list(request.prompt_ids)
    output = SequenceOutput(rules, prompt, IncrementalDetokenizer(tokenizer, prompt))
    grammar = request.grammar
    constraint = grammar.constraint(vocab_size) if grammar else None
    return RequestState(request.request_id, prompt, RowSampler(request.sampling.resolve(global_topk)), output, sink,
                        prompt_logprobs=request.prompt_logprobs, adapter=request.adapter, constraint=constraint,
                        spec=SpecStats.new(spec_length) if spec_length else None)
