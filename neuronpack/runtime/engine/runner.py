"""The model runner: executes a ``StepPlan`` (plan.py) against the compiled model and returns typed outputs, the
"execute" of the engine's schedule / execute / update split. Rows come from the plan (the scheduler's
``RowAllocator``), sampling and stop rules stay in the engine, which applies what this returns; the only state
kept here is what a prompt prefilled over several steps needs at its end (its prompt logits, an EAGLE draft's
hidden states).

- ``move_rows``: the plan's row moves (copies, swaps, prefix-pool block copies), applied to the target's KV cache
  and to the EAGLE draft's (same rows).
- ``prefill``: every chunk that needs only its last logits in one call (right padded: the weights are read once for
  all of them; an EAGLE proposer gets the prompts' hidden states once a prompt's last chunk ran), a prompt asking
  for prompt logprobs in its own ``prompt_logits`` call, then each finished group's fork copies. One
  ``PrefillOutput`` per group, an error instead of logits for a group whose call failed. A group's chunk is its
  prompt's positions ``start..stop-1`` (prefix caching and earlier chunks: the positions below hold its KV
  already); the scheduler cuts a long prompt into chunks of at most the largest context bucket (one call's tokens)
  that run between decode steps (chunked prefill).
- ``decode``: one step over the plan's decode rows -> logits [n, vocab] in row order.
- ``speculate``: draft, verify and accept over the decode rows (speculation/step.py) -> the tokens each row keeps.

Example::

    runner = ModelRunner(model)
    runner.move_rows(plan.moves)
    outputs = runner.prefill(plan.prefills)          # {request_id: PrefillOutput}
    logits = runner.decode(decode_plan.decodes)      # [n, vocab]
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from neuronpack.runtime.engine.kv_rows import Move, RowCopy, RowSwap
from neuronpack.runtime.engine.plan import DecodeRow, PrefillGroup

if TYPE_CHECKING:
    from torch import Tensor

    from neuronpack.runtime.engine.requests import CompiledModel
    from neuronpack.runtime.engine.speculation.acceptance import Accepted
    from neuronpack.runtime.engine.speculation.stats import SpecStats
    from neuronpack.runtime.engine.speculation.step import SpecRow, SpeculativeStep


@dataclass(frozen=True)
class PrefillOutput:
    """What a prefill group gets: once its last chunk ran (``done``), the last prompt token's logits [1, vocab], with
    prompt logprobs every position's [len, vocab] too (``all_logits``); or the error that ended the group;
    ``seconds``: its own model time."""

    logits: Tensor | None = None
    all_logits: Tensor | None = None
    error: Exception | None = None
    seconds: float = 0.0
    done: bool = True


class ModelRunner:
    """Runs plans on ``model``; ``speculator``: the draft-then-verify step of a speculating engine (its proposer
    drafts in the same rows)."""

    def __init__(self, model: CompiledModel, speculator: SpeculativeStep | None = None) -> None:
        self.model = model
        self.speculator = speculator
        self.proposer = speculator.proposer if speculator is not None else None
        self._lora = bool(getattr(model, "adapter_names", ()))
        self.chunk = max(model.context_buckets)  # tokens per row one prefill call takes
        # A prompt prefilled over several steps: its prompt logits and (EAGLE) hidden states so far, by request id.
        self._pieces: dict[str, list[Tensor]] = {}

    def move_rows(self, moves: Sequence[Move]) -> None:
        """Apply the plan's row moves to every cache that is addressed by row: the target's (copies, swaps, block
        copies to and from the prefix pool) and the EAGLE proposer's draft cache (an EAGLE engine caches no prefix:
        a swap moves a decoding sequence's draft KV one way, the other row holds no draft KV yet)."""
        if not moves:
            return
        if hasattr(self.model, "move_kv"):
            self.model.move_kv(moves)
        else:
            self.model.copy_rows(moves)
        if self.proposer is not None:
            self.proposer.copy_rows([m if isinstance(m, RowCopy) else RowCopy(m.b, m.a, m.length_b)
                                     for m in moves if isinstance(m, RowCopy | RowSwap)])

    def prefill(self, groups: Sequence[PrefillGroup]) -> dict[str, PrefillOutput]:
        """Run every group's chunk (see the module docstring); one output per group, by request id."""
        shared = [g for g in groups if not g.own_call]
        outputs = self._prefill_together(shared)
        for group in groups:
            if group.own_call:
                outputs[group.request_id] = self._prompt_logits(group)
            out = outputs[group.request_id]
            if out.error is None and out.done and group.fork_copies and not group.scoring_only:
                try:
                    self.model.copy_rows(group.fork_copies)
                except Exception as exc:
                    outputs[group.request_id] = PrefillOutput(error=exc)
        return outputs

    def forget(self, request_id: str) -> None:
        """A sequence ended before its last chunk: drop what its earlier chunks left here."""
        self._pieces.pop(request_id, None)

    def decode(self, rows: Sequence[DecodeRow]) -> Tensor:
        """One decode step over ``rows`` (one window of adjacent rows: the graph runs at the batch of decoding
        sequences, not the compiled batch) -> float32 logits [n, vocab] in the same order."""
        import torch

        tokens = torch.tensor([r.token for r in rows])
        positions = torch.tensor([r.position for r in rows])
        return self.model.decode(tokens, positions, [r.row for r in rows], **self._adapters(rows))

    def speculate(self, rows: Sequence[SpecRow]) -> tuple[list[Accepted], SpecStats]:
        """Draft, verify and accept for every row (a speculating runner only)."""
        if self.speculator is None:
            raise RuntimeError("this runner has no speculative step")
        return self.speculator.run(rows)

    def _prefill_together(self, groups: Sequence[PrefillGroup]) -> dict[str, PrefillOutput]:
        """The groups' chunks share one call (a row whose start + the call's width would pass the sequence length
        goes alone)."""
        width = max((len(g.tokens) for g in groups), default=0)
        fits = [g for g in groups if g.start + width <= self.model.max_seq_len]
        calls = [fits] if fits else []
        calls += [[g] for g in groups if g.start + width > self.model.max_seq_len]
        outputs: dict[str, PrefillOutput] = {}
        for call in calls:
            outputs.update(self._prefill_call(call))
        return outputs

    def _prefill_call(self, groups: Sequence[PrefillGroup]) -> dict[str, PrefillOutput]:
        import torch

        started = time.monotonic()
        try:
            logits, hidden = self._run_prefill([g.row for g in groups], [g.tokens for g in groups],
                                               [g.start for g in groups], groups)
            if hidden is not None:  # EAGLE: the draft reads the whole prompt's hidden states, once it is prefilled
                done = [g for g in groups if g.done]
                for i, g in enumerate(groups):
                    self._keep(g, hidden[i, : len(g.tokens)])
                if done:
                    self.proposer.prefilled([g.request_id for g in done],
                                            [torch.cat(self._pieces.pop(g.request_id)) for g in done])
        except Exception as exc:
            for g in groups:
                self.forget(g.request_id)
            return {g.request_id: PrefillOutput(error=exc) for g in groups}
        seconds = time.monotonic() - started
        return {g.request_id: PrefillOutput(logits=logits[i : i + 1] if g.done else None, seconds=seconds,
                                            done=g.done) for i, g in enumerate(groups)}

    def _keep(self, group: PrefillGroup, piece: Tensor) -> None:
        if group.first:
            self._pieces[group.request_id] = []
        self._pieces[group.request_id].append(piece)

    def _run_prefill(self, rows: list[int], pieces: list[Sequence[int]], starts: list[int],
                     groups: Sequence[PrefillGroup]) -> tuple[Tensor, Tensor | None]:
        """One prefill call -> (last logits [n, vocab], hidden [n, width, H] for an EAGLE proposer, else None)."""
        at = {"starts": starts} if any(starts) else {}
        if self.proposer is None or not self.proposer.needs_hidden_states:
            return self.model.prefill(rows, pieces, **self._adapters(groups), **at), None
        # speculation excludes LoRA; an EAGLE engine does not reuse cached prefixes (starts are chunk offsets)
        return self.model.prefill_hidden(rows, pieces, self.proposer.hidden_layers, **at)

    def _prompt_logits(self, group: PrefillGroup) -> PrefillOutput:
        """Every position's logits of the group's chunk (prompt logprobs), kept until the last chunk."""
        import torch

        started = time.monotonic()
        try:
            adapter = {"adapter": group.adapter} if self._lora else {}
            at = {"start": group.start} if group.start else {}
            self._keep(group, self.model.prompt_logits(group.tokens, group.row, **adapter, **at))  # [T, vocab]
        except Exception as exc:
            self.forget(group.request_id)
            return PrefillOutput(error=exc)
        seconds = time.monotonic() - started
        if not group.done:
            return PrefillOutput(seconds=seconds, done=False)
        pieces = self._pieces.pop(group.request_id)
        every = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        return PrefillOutput(logits=every[-1:], all_logits=every, seconds=seconds)

    def _adapters(self, rows: Sequence[DecodeRow | PrefillGroup]) -> dict:
        """The LoRA argument of a model call: every row's adapter (nothing for models without adapters)."""
        return {"adapters": [r.adapter for r in rows]} if self._lora else {}
