"""Per-request sampling with vLLM's dynamic on-device sampling semantics (see docs/neuron.md, "Facts the code
relies on").

Each running sequence is one row with its own (top_k, top_p, temperature) and its own ``torch.Generator``, so a
seeded request samples the same tokens whatever else shares the batch. Rules, as on Neuron:

- temperature 0 (below 1e-5, as in vLLM) means greedy: the row becomes (top_k 1, top_p 1.0, temperature 1.0);
- top_k < 1 or > global_topk becomes global_topk: sampling never looks past the global_topk best logits.

A row whose params ask for ``logprobs`` (top-N) also gets the sampled token's logprob under the distribution it was
drawn from (see ``logprobs.py`` for which one).

Example::

    params = SamplingParams(temperature=0.7, top_k=50, top_p=0.9, seed=1).resolve(global_topk=256)
    sampler = RowSampler(params)
    token_ids = sample_rows(logits, [sampler])          # logits: float32 [1, vocab] -> [1] int64
    token_ids, logprobs = sample(logits, [sampler])     # logprobs: [TokenLogprobs | None] per row
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from neuronpack.runtime.engine.logprobs import TokenLogprobs, from_log_distribution

if TYPE_CHECKING:
    from torch import Tensor

DEFAULT_GLOBAL_TOPK = 256
SAMPLING_EPS = 1e-5  # vLLM's _SAMPLING_EPS: a temperature below it is greedy


@dataclass(frozen=True)
class SamplingParams:
    """What a request asked for. ``top_k`` -1 (or any value < 1) means "no limit" (capped at global_topk).
    ``logprobs``: None for none, else how many best alternatives to report with each sampled token (0..20)."""

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    logprobs: int | None = None

    def resolve(self, global_topk: int = DEFAULT_GLOBAL_TOPK) -> SamplingParams:
        """Apply the on-device rules: greedy for temperature 0, top_k clamped into 1..global_topk.

        Example: ``SamplingParams(temperature=0).resolve().top_k == 1``.
        """
        if self.temperature < SAMPLING_EPS:  # tiny temperatures overflow float32 logits / temperature
            return replace(self, temperature=1.0, top_k=1, top_p=1.0)
        top_k = global_topk if self.top_k < 1 or self.top_k > global_topk else self.top_k
        return replace(self, top_k=top_k)

    @property
    def greedy(self) -> bool:
        return self.top_k == 1


class RowSampler:
    """Resolved parameters plus the request's own random stream (seeded when the request gives a seed)."""

    def __init__(self, params: SamplingParams) -> None:
        import torch

        self.params = params
        self.generator = torch.Generator()
        seed = params.seed if params.seed is not None else random.SystemRandom().getrandbits(63)
        self.generator.manual_seed(seed)


def sample_rows(logits: Tensor, samplers: Sequence[RowSampler]) -> Tensor:
    """One next token per row. logits: float32 [n, vocab]; samplers: n resolved row samplers -> int64 [n].

    Greedy rows take the argmax; the others sample among their top-k (at most global_topk) candidates after
    temperature and top-p (nucleus) filtering.

    Example: ``sample_rows(torch.tensor([[0.0, 5.0, 1.0]]), [RowSampler(SamplingParams(temperature=0).resolve())])``
    returns ``tensor([1])``.
    """
    return sample(logits, samplers)[0]


def sample(logits: Tensor, samplers: Sequence[RowSampler]) -> tuple[Tensor, list[TokenLogprobs | None]]:
    """``sample_rows`` plus, for rows whose params ask for logprobs, the sampled token's entry (else None)."""
    import torch

    n = logits.shape[0]
    if n != len(samplers):
        raise ValueError(f"{n} logit rows but {len(samplers)} samplers")
    out = torch.argmax(logits, dim=-1)  # [n]
    logprobs: list[TokenLogprobs | None] = [None] * n
    rows = [i for i, s in enumerate(samplers) if not s.params.greedy]
    if rows:
        picked, row_logprobs = _sample_filtered(logits[rows], [samplers[i] for i in rows])
        out[rows] = picked
        for i, entry in zip(rows, row_logprobs, strict=True):
            logprobs[i] = entry
    for i, s in enumerate(samplers):
        if s.params.greedy and s.params.logprobs is not None:
            logp = torch.log_softmax(logits[i].float(), dim=-1)
            logprobs[i] = from_log_distribution(logp, int(out[i]), s.params.logprobs)
    return out, logprobs


def filtered_distribution(logits: Tensor, params: Sequence[SamplingParams], candidates: int = 0
                          ) -> tuple[Tensor, Tensor]:
    """Each row's sampling distribution after temperature, top-k and top-p, over its best candidates.

    logits: float32 [m, vocab]; params: m resolved sampling params; candidates: at least this many columns.
    Returns (probs, ids), both [m, K] with K = max(largest top_k, candidates) capped at vocab, sorted best first:
    ``probs[i, j]`` is the (unnormalised) weight of token ``ids[i, j]``, 0 beyond row i's top_k and outside its
    nucleus. ``sample`` draws from it; speculative decoding's rejection sampler compares drafts against it.
    """
    import torch

    max_k = min(max(max(p.top_k for p in params), candidates), logits.shape[-1])
    top_values, top_ids = torch.topk(logits.float(), max_k, dim=-1)  # [m, K], sorted descending
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)[:, None]
    top_k = torch.tensor([p.top_k for p in params])[:, None]
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)[:, None]
    scaled = top_values / temperature
    rank = torch.arange(max_k)[None, :]  # [1, K]
    scaled = scaled.masked_fill(rank >= top_k, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    # Nucleus: keep a candidate while the mass of the better ones is still below top_p (the best one always stays,
    # even when top_p rounds to 0 in float32).
    mass_before = torch.cumsum(probs, dim=-1) - probs
    probs = probs.masked_fill((mass_before >= top_p) & (rank > 0), 0.0)  # the best one always stays
    return probs, top_ids


def _sample_filtered(logits: Tensor, samplers: Sequence[RowSampler]) -> tuple[Tensor, list[TokenLogprobs | None]]:
    # logits: [m, vocab] for the sampling rows only.
    import torch

    wanted = max((s.params.logprobs or 0) for s in samplers)
    probs, top_ids = filtered_distribution(logits, [s.params for s in samplers], wanted)
    max_k = probs.shape[-1]
    # Each row draws over its own top_k candidates only: multinomial consumes one random number per candidate, so
    # a longer row (another row's larger top_k, or more logprobs asked) would change a seeded row's tokens.
    picks = [
        torch.multinomial(probs[i, : min(sampler.params.top_k, max_k)], 1, generator=sampler.generator)
        for i, sampler in enumerate(samplers)
    ]  # each [1], an index into the row's candidates
    choice = torch.cat(picks)[:, None]  # [m, 1]
    tokens = top_ids.gather(1, choice)[:, 0]
    entries: list[TokenLogprobs | None] = [None] * len(samplers)
    if any(s.params.logprobs is not None for s in samplers):
        # The distribution actually sampled from, renormalised over the kept candidates: [m, K], -inf outside.
        logp = (probs / probs.sum(dim=-1, keepdim=True)).log()
        for i, s in enumerate(samplers):
            if s.params.logprobs is None:
                continue
            c, n = int(choice[i, 0]), s.params.logprobs
            top = tuple(zip(top_ids[i, :n].tolist(), logp[i, :n].tolist(), strict=True))
            entries[i] = TokenLogprobs(int(tokens[i]), float(logp[i, c]), top)
    return tokens, entries


__all__ = ["DEFAULT_GLOBAL_TOPK", "RowSampler", "SamplingParams", "filtered_distribution", "sample",
           "sample_rows"]
