"""EAGLE proposer: drafts with an EAGLE draft model (``neuronpack.models.eagle``: EAGLE-1/2 or EAGLE-3) fed by the
target's hidden states (``hidden_layers``: which ones the target's verify and prefill calls return).

Per running sequence it keeps the draft's own KV cache and the target hidden states not fed to the draft yet. For a
sequence x_0..x_{n-1} (x_{n-1} not yet in the target's cache), draft position j holds the pair (x_{j+1}, h_j):

- ``prefilled``: the prompt's hidden states h_0..h_{p-1} (from the prefill call, through the draft's ``from_target``)
  become pending.
- ``propose``: the pending pairs (their tokens are known by now) run through the draft in one call and fill its
  cache; its last output gives d1 = argmax; each further draft feeds (d_i, the draft's own output) at the next
  position (greedy drafting: rejection sampling treats the draft as one-hot, which is exact for a deterministic
  draft).
- ``verified``: the hidden states of the positions the target kept (accepted drafts + 1) become pending (through
  ``from_target``); the draft's tentative positions past them are overwritten by the next catch-up.

A sequence whose prompt hidden states never came (prompt logprobs, forks of a parallel request) starts its draft
context at its first verified position (RoPE is relative, so positions count from there). The running sequences
draft together: one catch-up call over all of them (rows right padded), then one call per further draft token.
The draft's KV cache has the target's rows: each sequence drafts in the row the scheduler's ``RowAllocator`` gave it
(``DraftRequest.row``), and the row moves of a step's plan are applied here too (``copy_rows``); the proposer keeps
no row bookkeeping of its own. A call runs the draft's ``forward`` and ``logits``
eagerly, or the artifact's compiled draft graphs (``DraftGraphs``: the same functions with the weights as inputs).

Example::

    proposer = EagleProposer(load_eagle_draft(Path("artifact/draft"), torch.float32, target_layers=30), rows=4)
    proposer.prefilled(["r1"], [hidden_of_prompt])          # [p, H]
    proposer.propose([DraftRequest("r1", ids, max_tokens=3, row=0)])[0].token_ids
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from neuronpack.models.eagle import EagleDraft
from neuronpack.models.llama import store_kv
from neuronpack.runtime.engine.speculation.proposer import Draft, DraftRequest

# Draft cache positions allocated at first (grown by doubling).
INITIAL_CACHE = 256


@dataclass
class _Sequence:
    """One sequence's draft state: pairs ``base..filled-1`` are in its row of the draft cache (at index j - base);
    ``pending`` holds the target hidden states of positions ``filled..`` not fed yet; ``length`` its token count at
    the last propose."""

    base: int
    filled: int
    length: int = 0
    pending: list[Tensor] = field(default_factory=list)  # [m, H] chunks

    @property
    def pending_count(self) -> int:
        return sum(int(h.shape[0]) for h in self.pending)


class DraftGraphs(Protocol):
    """Compiled replacements of the draft's two functions (the portable artifact's draft graphs)."""

    def core(self, tokens: Tensor, hidden: Tensor, cos: Tensor, sin: Tensor, past: Tensor, k_past: Tensor,
             v_past: Tensor) -> tuple[Tensor, Tensor, Tensor]: ...

    def logits(self, z: Tensor) -> Tensor: ...


class EagleProposer:
    """The ``Proposer`` for ``[speculation] kind = "eagle"`` (greedy chain drafts, EAGLE-1/2 or EAGLE-3);
    ``graphs``: the draft's compiled graphs (None: the draft runs eagerly); ``rows``: the target's KV rows (its
    compiled batch), the rows of the draft cache."""

    needs_hidden_states = True

    def __init__(self, draft: EagleDraft, graphs: DraftGraphs | None = None, rows: int = 1) -> None:
        self.draft = draft
        self.hidden_layers = draft.target_layers  # what the target returns for it (None: final-normed states)
        self._core = graphs.core if graphs is not None else None
        self._logits = graphs.logits if graphs is not None else draft.logits
        self._seqs: dict[str, _Sequence] = {}
        self._min_rows = rows
        self.k: Tensor | None = None  # [layers, rows, kv, positions, hd]: the target's rows
        self.v: Tensor | None = None

    def prefilled(self, request_ids: Sequence[str], hidden: Sequence[Tensor]) -> None:
        """The prompts' target hidden states, one [prompt_len, H] (EAGLE-3: [prompt_len, 3H]) per request."""
        with torch.inference_mode():
            for rid, h in zip(request_ids, hidden, strict=True):
                self._new(rid, 0).length = int(h.shape[0]) + 1
                self._seqs[rid].pending.append(self.draft.from_target(h))

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        live = {r.request_id for r in requests}
        for rid in [rid for rid in self._seqs if rid not in live]:  # finished sequences
            del self._seqs[rid]
        with torch.inference_mode():
            return self._propose(requests)

    def verified(self, request_ids: Sequence[str], accepted: Sequence[int], hidden: Tensor | None) -> None:
        if hidden is None:
            raise ValueError("the EAGLE proposer needs the target's hidden states from verify")
        with torch.inference_mode():
            kept_hidden = self.draft.from_target(hidden)
        for i, (rid, kept) in enumerate(zip(request_ids, accepted, strict=True)):
            seq = self._seqs[rid]
            if seq.filled + seq.pending_count != seq.length - 1:  # hidden states must follow on without a gap
                raise RuntimeError(f"EAGLE draft state of {rid} out of step: {seq.filled} + {seq.pending_count} "
                                   f"pending != verify start {seq.length - 1}")
            seq.pending.append(kept_hidden[i, : kept + 1])

    def copy_rows(self, copies: Sequence[tuple[int, int, int]]) -> None:
        """Apply the plan's row moves: ``(src, dst, length)`` copies the draft KV of row src into row dst (draft
        indices trail target positions: j - base <= j, so ``length`` covers them)."""
        if self.k is None:
            return
        self._grow(rows=1 + max(max(src, dst) for src, dst, _ in copies))
        with torch.inference_mode():
            for src, dst, length in copies:
                n = min(length, self.k.shape[3])
                for cache in (self.k, self.v):
                    cache[:, dst, :, :n] = cache[:, src, :, :n]

    # -- drafting ----------------------------------------------------------------------------------------------
    def _new(self, rid: str, base: int) -> _Sequence:
        seq = self._seqs[rid] = _Sequence(base=base, filled=base)
        return seq

    def _propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        """Catch up every sequence with pending pairs in one draft call (rows right padded), then draft all of them
        together one token per call."""
        drafts: list[list[int]] = [[] for _ in requests]
        active, token_rows, hidden_rows = [], [], []
        for i, request in enumerate(requests):
            n = len(request.token_ids)
            seq = self._seqs.get(request.request_id)
            if seq is None:  # no prompt hidden states: the draft context starts at the next verified position
                seq = self._new(request.request_id, n - 1)
            seq.length = n
            if not seq.pending or request.max_tokens <= 0:
                continue
            hidden = torch.cat(seq.pending)  # [m, H]: positions filled..n-2
            tokens = list(request.token_ids[seq.filled + 1 : n])  # their pairs' tokens x_{j+1}
            if len(tokens) != hidden.shape[0]:
                raise RuntimeError(f"EAGLE draft state of {request.request_id}: {hidden.shape[0]} hidden states for "
                                   f"{len(tokens)} tokens")
            active.append(i)
            token_rows.append(tokens)
            hidden_rows.append(hidden)
        if not active:
            return [Draft([]) for _ in requests]
        seqs = [self._seqs[requests[i].request_id] for i in active]
        rows = torch.tensor([requests[i].row for i in active])
        lengths = torch.tensor([len(t) for t in token_rows])
        width = int(lengths.max())
        tokens = torch.tensor([t + [t[-1]] * (width - len(t)) for t in token_rows])  # padding: masked, overwritten
        hidden = torch.stack([torch.cat((h, h[-1:].expand(width - h.shape[0], -1))) for h in hidden_rows])
        starts = torch.tensor([s.filled - s.base for s in seqs])
        out = self._run(rows, tokens, hidden, starts)  # [A, width, H]
        last = out[torch.arange(len(seqs)), lengths - 1]  # [A, H]
        positions = starts + lengths
        for seq, request_i in zip(seqs, active, strict=True):
            seq.filled, seq.pending = len(requests[request_i].token_ids) - 1, []
        wanted = [requests[i].max_tokens for i in active]
        for step in range(max(wanted)):
            picked = torch.argmax(self._logits(last), dim=-1).tolist()  # [A]
            for a, i in enumerate(active):
                if step < wanted[a]:
                    drafts[i].append(picked[a])
            if step + 1 == max(wanted):
                break
            # tentative positions: overwritten by the next catch-up once the target has verified them
            last = self._run(rows, torch.tensor(picked)[:, None], last[:, None], positions)[:, 0]
            positions = positions + 1
        return [Draft(d) for d in drafts]

    def _run(self, rows: Tensor, tokens: Tensor, hidden: Tensor, starts: Tensor) -> Tensor:
        """Run pairs [A, T] in cache ``rows`` from index ``starts``; store their K/V; return the outputs [A, T, H]."""
        t = tokens.shape[1]
        n_past = max(1, int(starts.max()))  # at least one (masked) position: a dimension of 0 fails in a graph
        self._grow(rows=max(self._min_rows, 1 + int(rows.max())), positions=n_past + t)
        k = self.k[:, rows, :, :n_past]  # [layers, A, kv, n_past, hd] (a copy: rows are scattered)
        v = self.v[:, rows, :, :n_past]
        out, new_k, new_v = self.draft.forward_step(tokens, hidden, starts, k, v, n_past, run_core=self._core)
        store_kv(self.k, rows, starts, new_k)
        store_kv(self.v, rows, starts, new_v)
        return out

    def _rows(self) -> int:
        return 0 if self.k is None else self.k.shape[1]

    def _grow(self, *, rows: int = 0, positions: int = 0) -> None:
        """Make the cache at least ``rows`` x ``positions`` (doubling), keeping what it holds."""
        old_rows, old_positions = self._rows(), 0 if self.k is None else self.k.shape[3]
        if rows <= old_rows and positions <= old_positions:
            return
        new_rows, new_positions = max(rows, old_rows), old_positions
        if positions > old_positions:
            new_positions = max(INITIAL_CACHE, 2 * old_positions, positions)
        cfg = self.draft.config
        shape = (cfg.num_layers, new_rows, cfg.num_kv_heads, max(new_positions, INITIAL_CACHE), cfg.head_dim)
        k, v = (torch.zeros(shape, dtype=self.draft.dtype) for _ in range(2))
        if self.k is not None:
            k[:, :old_rows, :, :old_positions], v[:, :old_rows, :, :old_positions] = self.k, self.v
        self.k, self.v = k, v
