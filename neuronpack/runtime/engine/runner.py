"""The model runner: executes a ``StepPlan`` (plan.py) against the compiled model and returns typed outputs, the
"execute" of the engine's schedule / execute / update split. It owns no state of its own: rows come from the plan
(the scheduler's ``RowAllocator``), sampling and stop rules stay in the engine, which applies what this returns.

- ``move_rows``: the plan's row copies, applied to the target's KV cache and to the EAGLE draft's (same rows).
- ``prefill``: every prompt that needs only its last logits in one call (right padded: the weights are read once for
  all of them; an EAGLE proposer gets the prompts' hidden states), a prompt asking for prompt logprobs in its own
  ``prompt_logits`` call, then each group's fork copies. One ``PrefillOutput`` per group, an error instead of logits
  for a group whose call failed. A group prefills from its ``start`` (prefix caching: the positions below hold its
  KV already); a prompt whose uncached part is longer than the largest context bucket (one call's tokens) is
  prefilled alone in chunks of that size, each from the position after the last (chunked prefill).
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

from neuronpack.runtime.engine.plan import DecodeRow, PrefillGroup

if TYPE_CHECKING:
    from torch import Tensor

    from neuronpack.runtime.engine.kv_rows import RowCopy
    from neuronpack.runtime.engine.requests import CompiledModel
    from neuronpack.runtime.engine.speculation.acceptance import Accepted
    from neuronpack.runtime.engine.speculation.stats import SpecStats
    from neuronpack.runtime.engine.speculation.step import SpecRow, SpeculativeStep


@dataclass(frozen=True)
class PrefillOutput:
    """What a prefill group gets: the last prompt token's logits [1, vocab], with prompt logprobs every position's
    [len, vocab] too (``all_logits``), or the error that ended the group; ``seconds``: its own model time."""

    logits: Tensor | None = None
    all_logits: Tensor | None = None
    error: Exception | None = None
    seconds: float = 0.0


class ModelRunner:
    """Runs plans on ``model``; ``speculator``: the draft-then-verify step of a speculating engine (its proposer
    drafts in the same rows)."""

    def __init__(self, model: CompiledModel, speculator: SpeculativeStep | None = None) -> None:
        self.model = model
        self.speculator = speculator
        self.proposer = speculator.proposer if speculator is not None else None
        self._lora = bool(getattr(model, "adapter_names", ()))
        self.chunk = max(model.context_buckets)  # tokens per row one prefill call takes

    def move_rows(self, moves: Sequence[RowCopy]) -> None:
        """Apply the plan's row copies (compaction) to every cache that is addressed by row."""
        if not moves:
            return
        self.model.copy_rows(moves)
        if self.proposer is not None:
            self.proposer.copy_rows(moves)

    def prefill(self, groups: Sequence[PrefillGroup]) -> dict[str, PrefillOutput]:
        """Run every group's prefill (see the module docstring); one output per group, by request id."""
        shared = [g for g in groups if not g.own_call]
        outputs = self._prefill_together(shared)
        for group in groups:
            if group.own_call:
                outputs[group.request_id] = self._prompt_logits(group)
            out = outputs[group.request_id]
            if out.error is None and group.fork_copies and not group.scoring_only:
                try:
                    self.model.copy_rows(group.fork_copies)
                except Exception as exc:
                    outputs[group.request_id] = PrefillOutput(error=exc)
        return outputs

    def decode(self, rows: Sequence[DecodeRow]) -> Tensor:
        """One decode step over ``rows`` (rows 0..n-1: the graph runs at the batch of running sequences, not the
        compiled batch) -> float32 logits [n, vocab] in the same order."""
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
        """The groups whose uncached tokens fit one call share it (a row whose start + the call's width would pass
        the sequence length goes alone); longer ones are chunked."""
        short = [g for g in groups if len(g.prompt_ids) - g.start <= self.chunk]
        outputs = {g.request_id: self._chunked(g) for g in groups if len(g.prompt_ids) - g.start > self.chunk}
        width = max((len(g.prompt_ids) - g.start for g in short), default=0)
        fits = [g for g in short if g.start + width <= self.model.max_seq_len]
        calls = [fits] if fits else []
        calls += [[g] for g in short if g.start + width > self.model.max_seq_len]
        for call in calls:
            outputs.update(self._prefill_call(call))
        return outputs

    def _prefill_call(self, groups: Sequence[PrefillGroup]) -> dict[str, PrefillOutput]:
        started = time.monotonic()
        try:
            logits, hidden = self._run_prefill([g.row for g in groups], [g.prompt_ids[g.start:] for g in groups],
                                               [g.start for g in groups], groups)
            if hidden is not None:
                self.proposer.prefilled([g.request_id for g in groups],
                                        [hidden[i, : len(g.prompt_ids)] for i, g in enumerate(groups)])
        except Exception as exc:
            return {g.request_id: PrefillOutput(error=exc) for g in groups}
        seconds = time.monotonic() - started
        return {g.request_id: PrefillOutput(logits=logits[i : i + 1], seconds=seconds) for i, g in enumerate(groups)}

    def _chunked(self, group: PrefillGroup) -> PrefillOutput:
        """One prompt, chunk by chunk from its start: each chunk attends to the row's positions before it."""
        import torch

        started = time.monotonic()
        prompt, hiddens = group.prompt_ids, []
        try:
            for offset in range(group.start, len(prompt), self.chunk):
                logits, hidden = self._run_prefill([group.row], [prompt[offset:offset + self.chunk]], [offset],
                                                   [group])
                if hidden is not None:
                    hiddens.append(hidden[0, : min(self.chunk, len(prompt) - offset)])
            if hiddens:  # EAGLE: the draft reads the whole prompt's hidden states, as after one call
                self.proposer.prefilled([group.request_id], [torch.cat(hiddens)])
        except Exception as exc:
            return PrefillOutput(error=exc)
        return PrefillOutput(logits=logits[0:1], seconds=time.monotonic() - started)

    def _run_prefill(self, rows: list[int], pieces: list[Sequence[int]], starts: list[int],
                     groups: Sequence[PrefillGroup]) -> tuple[Tensor, Tensor | None]:
        """One prefill call -> (last logits [n, vocab], hidden [n, width, H] for an EAGLE proposer, else None)."""
        at = {"starts": starts} if any(starts) else {}
        if self.proposer is None or not self.proposer.needs_hidden_states:
            return self.model.prefill(rows, pieces, **self._adapters(groups), **at), None
        # speculation excludes LoRA; an EAGLE engine does not reuse cached prefixes (starts are chunk offsets)
        return self.model.prefill_hidden(rows, pieces, self.proposer.hidden_layers, **at)

    def _prompt_logits(self, group: PrefillGroup) -> PrefillOutput:
        """Every prompt position's logits (prompt logprobs): from position 0, chunk by chunk when it is long."""
        import torch

        started = time.monotonic()
        prompt, pieces = group.prompt_ids, []
        try:
            adapter = {"adapter": group.adapter} if self._lora else {}
            for offset in range(0, len(prompt), self.chunk):
                at = {"start": offset} if offset else {}
                pieces.append(self.model.prompt_logits(prompt[offset:offset + self.chunk], group.row, **adapter,
                                                       **at))  # [T, vocab], KV written
            every = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        except Exception as exc:
            return PrefillOutput(error=exc)
        return PrefillOutput(logits=every[-1:], all_logits=every, seconds=time.monotonic() - started)

    def _adapters(self, rows: Sequence[DecodeRow | PrefillGroup]) -> dict:
        """The LoRA argument of a model call: every row's adapter (nothing for models without adapters)."""
        return {"adapters": [r.adapter for r in rows]} if self._lora else {}
