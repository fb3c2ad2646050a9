"""How many token positions one engine step may run while streams decode (vLLM's ``--max-num-batched-tokens``),
torch-free: a fixed number when the option is given, else a budget that follows this machine's own timings so
that a running stream's gap between two tokens (one step: the prompts' chunk, then the decode step) stays near
``GAP_STEPS`` decode steps: the chunk gets about ``GAP_STEPS - 1`` decode steps' worth of prefill time. Issue 49's
bound is a p99 gap of 3 decode steps; aiming at 2.5 leaves the jitter of a busy machine room under it.

The timings are moving averages of what the engine measures: one decode step's seconds, and a prefill call's
seconds per token position. While streams decode, the calls are the chunks themselves, so the estimate settles on
what a chunk of that size costs per token (a short chunk costs more per token than a long prompt's call). A chunk
is never cut below ``MIN_CHUNK`` tokens (a prompt must make progress on a busy machine) nor above the largest
context bucket.

Example::

    budget = StepBudget(None, max_chunk=512)       # automatic
    budget.observe_decode(0.030); budget.observe_prefill(0.150, 48)
    budget.step_tokens(decode_tokens=2)            # 2 + 1.5 x 0.030 / (0.150 / 48) = 16
    StepBudget(64, max_chunk=512).step_tokens(2)   # 64: fixed
"""

from __future__ import annotations

GAP_STEPS = 2.5  # a stream's gap while prompts are prefilled: about this many decode steps
MIN_CHUNK = 8  # prompt tokens a step prefills at least, whatever the timings say
FIRST_CHUNK = 32  # before any timing is known
SMOOTHING = 0.3  # weight of the newest timing in the moving averages


class StepBudget:
    """``fixed``: the step's token positions (``--max-num-batched-tokens``); None: from the measured timings."""

    def __init__(self, fixed: int | None, max_chunk: int) -> None:
        self.fixed, self.max_chunk = fixed, max_chunk
        self.decode_seconds: float | None = None  # one decode step
        self.token_seconds: float | None = None  # one prefill position

    @property
    def automatic(self) -> bool:
        return self.fixed is None

    def observe_decode(self, seconds: float) -> None:
        self.decode_seconds = _average(self.decode_seconds, seconds)

    def observe_prefill(self, seconds: float, positions: int) -> None:
        if positions > 0:
            self.token_seconds = _average(self.token_seconds, seconds / positions)

    def chunk_tokens(self) -> int:
        """Prompt tokens a step may prefill beside a decode step (automatic budget)."""
        if self.decode_seconds is None or not self.token_seconds:
            return min(FIRST_CHUNK, self.max_chunk)
        tokens = int((GAP_STEPS - 1) * self.decode_seconds / self.token_seconds)
        return max(MIN_CHUNK, min(self.max_chunk, tokens))

    def step_tokens(self, decode_tokens: int) -> int:
        """The token positions of a step whose decode step runs ``decode_tokens``."""
        return self.fixed if self.fixed is not None else decode_tokens + self.chunk_tokens()


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new
