"""EAGLE proposer: drafts with an EAGLE-1/2 draft model (``neuronpack.models.eagle``) fed by the target's hidden states.

Per running sequence it keeps the draft's own KV cache and the target hidden states not fed to the draft yet. For a
sequence x_0..x_{n-1} (x_{n-1} not yet in the target's cache), draft position j holds the pair (x_{j+1}, h_j):

- ``prefilled``: the prompt's hidden states h_0..h_{p-1} (from the prefill call) become pending.
- ``propose``: the pending pairs (their tokens are known by now) run through the draft in one call and fill its
  cache; its last output gives d1 = argmax; each further draft feeds (d_i, the draft's own output) at the next
  position (greedy drafting: rejection sampling treats the draft as one-hot, which is exact for a deterministic
  draft).
- ``verified``: the hidden states of the positions the target kept (accepted drafts + 1) become pending; the draft's
  tentative positions past them are overwritten by the next catch-up.

A sequence whose prompt hidden states never came (prompt logprobs, forks of a parallel request) starts its draft
context at its first verified position (RoPE is relative, so positions count from there). Sequences are drafted one
after the other in eager PyTorch (no AOT graph for the draft yet).

Example::

    proposer = EagleProposer(load_eagle_draft(Path("artifact/draft"), torch.float32))
    proposer.prefilled(["r1"], [hidden_of_prompt])          # [p, H]
    proposer.propose([DraftRequest("r1", ids, max_tokens=3)])[0].token_ids
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from neuronpack.models.eagle import EagleDraft
from neuronpack.models.llama import store_kv
from neuronpack.runtime.speculation.proposer import Draft, DraftRequest

# Draft cache positions allocated at a time per sequence (grown by doubling past that).
INITIAL_CACHE = 256


@dataclass
class _Sequence:
    """One sequence's draft state: pairs ``base..filled-1`` are in the cache (at index j - base); ``pending`` holds
    the target hidden states of positions ``filled..`` not fed yet; ``length`` its token count at the last propose."""

    base: int
    filled: int
    length: int = 0
    pending: list[Tensor] = field(default_factory=list)  # [m, H] chunks
    k: Tensor | None = None  # [layers, 1, kv, capacity, hd]
    v: Tensor | None = None

    @property
    def pending_count(self) -> int:
        return sum(int(h.shape[0]) for h in self.pending)


class EagleProposer:
    """The ``Proposer`` for ``[speculation] kind = "eagle"`` (greedy EAGLE-1/2 chain drafts)."""

    needs_hidden_states = True

    def __init__(self, draft: EagleDraft) -> None:
        self.draft = draft
        self._seqs: dict[str, _Sequence] = {}

    def prefilled(self, request_ids: Sequence[str], hidden: Sequence[Tensor]) -> None:
        """The prompts' target hidden states, one [prompt_len, H] per request."""
        for rid, h in zip(request_ids, hidden, strict=True):
            self._seqs[rid] = _Sequence(base=0, filled=0, length=int(h.shape[0]) + 1, pending=[h.detach()])

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        live = {r.request_id for r in requests}
        for rid in [rid for rid in self._seqs if rid not in live]:  # finished sequences
            del self._seqs[rid]
        with torch.inference_mode():
            return [self._propose_one(r) for r in requests]

    def verified(self, request_ids: Sequence[str], accepted: Sequence[int], hidden: Tensor | None) -> None:
        if hidden is None:
            raise ValueError("the EAGLE proposer needs the target's hidden states from verify")
        for i, (rid, kept) in enumerate(zip(request_ids, accepted, strict=True)):
            seq = self._seqs[rid]
            if seq.filled + seq.pending_count != seq.length - 1:  # hidden states must follow on without a gap
                raise RuntimeError(f"EAGLE draft state of {rid} out of step: {seq.filled} + {seq.pending_count} "
                                   f"pending != verify start {seq.length - 1}")
            seq.pending.append(hidden[i, : kept + 1].detach())

    # -- one sequence -------------------------------------------------------------------------------------------
    def _propose_one(self, request: DraftRequest) -> Draft:
        n = len(request.token_ids)
        seq = self._seqs.get(request.request_id)
        if seq is None:  # no prompt hidden states: the draft context starts at the next verified position
            seq = self._seqs[request.request_id] = _Sequence(base=n - 1, filled=n - 1)
        seq.length = n
        if not seq.pending or request.max_tokens <= 0:
            return Draft([])
        hidden = torch.cat(seq.pending)  # [m, H]: positions filled..n-2
        tokens = list(request.token_ids[seq.filled + 1 : n])  # their pairs' tokens x_{j+1}
        if len(tokens) != hidden.shape[0]:
            raise RuntimeError(f"EAGLE draft state of {request.request_id}: {hidden.shape[0]} hidden states for "
                               f"{len(tokens)} tokens")
        out = self._run(seq, tokens, hidden, seq.filled - seq.base)
        seq.filled, seq.pending = n - 1, []
        drafts: list[int] = []
        position = seq.filled - seq.base
        last = out[-1:]  # [1, H]
        while True:
            drafts.append(int(torch.argmax(self.draft.logits(last[-1]))))
            if len(drafts) == request.max_tokens:
                return Draft(drafts)
            last = self._run(seq, drafts[-1:], last, position)  # tentative: overwritten after verification
            position += 1

    def _run(self, seq: _Sequence, tokens: list[int], hidden: Tensor, start: int) -> Tensor:
        """Run pairs at cache index ``start..``; store their K/V; return the outputs [T, H]."""
        t = len(tokens)
        self._reserve(seq, start + t)
        layers = range(len(self.draft.layers))
        out, new_k, new_v = self.draft.forward_step(
            torch.tensor([tokens]), hidden[None], torch.tensor([start]), [seq.k[i] for i in layers],
            [seq.v[i] for i in layers], start)
        rows, starts = torch.zeros(1, dtype=torch.long), torch.tensor([start])
        store_kv(seq.k, rows, starts, new_k)
        store_kv(seq.v, rows, starts, new_v)
        return out[0]

    def _reserve(self, seq: _Sequence, positions: int) -> None:
        capacity = 0 if seq.k is None else seq.k.shape[3]
        if positions <= capacity:
            return
        cfg = self.draft.config
        size = max(INITIAL_CACHE, 2 * capacity, positions)
        shape = (cfg.num_layers, 1, cfg.num_kv_heads, size, cfg.head_dim)
        k, v = (torch.zeros(shape, dtype=self.draft.fc.weight.dtype) for _ in range(2))
        if seq.k is not None:
            k[:, :, :, :capacity], v[:, :, :, :capacity] = seq.k, seq.v
        seq.k, seq.v = k, v
