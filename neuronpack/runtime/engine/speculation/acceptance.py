"""Which drafted tokens a sequence keeps, given the target's logits at every drafted position.

The verify call scores ``[last, d1 .. dm]`` for a sequence: ``logits[j]`` is the target's distribution of the token
after position j, so ``logits[0]`` judges d1, ``logits[m]`` gives the token after the last draft (the bonus).

- Greedy requests (temperature 0): keep drafts while each equals the target's argmax, then add the target's argmax
  at the first mismatch (or the bonus after all m). The tokens are exactly the ones plain greedy decoding produces.
- Sampled requests: rejection sampling (Leviathan et al. 2023; vLLM's rejection sampler). Draft d_j drawn from q_j
  is kept with probability min(1, p_j(d) / q_j(d)); at the first rejection the token is drawn from
  norm(max(0, p_j - q_j)); after m acceptances a bonus token is drawn from p_m. p_j is the request's own sampling
  distribution (temperature, top-k, top-p exactly as ``sampling.filtered_distribution``), every random number comes
  from the request's own generator, and the emitted tokens are distributed exactly as plain sampling's. Prompt
  lookup drafts are deterministic: q_j is one-hot, so d is kept with probability p_j(d) and a rejection redraws from
  p_j without d.
- A sequence without drafts samples its one token through ``sampling.sample`` like a plain decode step (the same
  random stream use, so a seeded request with no drafts gets plain decoding's tokens).

Example::

    out = accept(logits, [Draft([5, 9])], [sampler])     # logits: float32 [1, 3, vocab]
    out[0].token_ids, out[0].num_accepted                 # e.g. [5, 7], 1
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from neuronpack.runtime.engine.logprobs import TokenLogprobs, from_log_distribution
from neuronpack.runtime.engine.sampling import RowSampler, filtered_distribution, sample
from neuronpack.runtime.engine.speculation.proposer import Draft

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class Accepted:
    """One sequence's outcome: the tokens to emit (kept drafts, then one of the target's), how many drafts it had
    and kept, and a logprobs entry per emitted token when its request asked for them."""

    token_ids: list[int]
    num_draft: int
    num_accepted: int
    logprobs: list[TokenLogprobs] | None = None


def accept(logits: Tensor, drafts: Sequence[Draft], samplers: Sequence[RowSampler]) -> list[Accepted]:
    """Accept drafts for n sequences. logits: float32 [n, T, vocab] from verify, T >= 1 + the longest draft (row i
    scored ``[last_i, *drafts[i].token_ids, padding]``; positions past its draft are ignored)."""
    n = logits.shape[0]
    if not n == len(drafts) == len(samplers):
        raise ValueError(f"{n} logit rows, {len(drafts)} drafts and {len(samplers)} samplers")
    if any(len(d.token_ids) >= logits.shape[1] for d in drafts):
        raise ValueError(f"a draft longer than the {logits.shape[1] - 1} positions verified")
    out: list[Accepted | None] = [None] * n
    plain = [i for i in range(n) if not drafts[i].token_ids]
    if plain:  # one batched sampling call, exactly as a plain decode step
        tokens, entries = sample(logits[plain, 0], [samplers[i] for i in plain])
        for i, token, entry in zip(plain, tokens.tolist(), entries, strict=True):
            out[i] = Accepted([token], 0, 0, None if entry is None else [entry])
    for i in range(n):
        if out[i] is None:
            m = len(drafts[i].token_ids)
            judge = _accept_greedy if samplers[i].params.greedy else _accept_sampled
            out[i] = judge(logits[i, : m + 1], drafts[i], samplers[i])
    return out  # type: ignore[return-value]


def _accept_greedy(logits: Tensor, draft: Draft, sampler: RowSampler) -> Accepted:
    # logits: [m + 1, vocab]
    import torch

    targets = torch.argmax(logits, dim=-1).tolist()  # [m + 1]
    kept = 0
    for d, t in zip(draft.token_ids, targets, strict=False):
        if d != t:
            break
        kept += 1
    tokens = [*draft.token_ids[:kept], targets[kept]]
    entries = None
    if sampler.params.logprobs is not None:
        logp = torch.log_softmax(logits[: kept + 1].float(), dim=-1)
        entries = [from_log_distribution(logp[j], t, sampler.params.logprobs) for j, t in enumerate(tokens)]
    return Accepted(tokens, len(draft.token_ids), kept, entries)


def _accept_sampled(logits: Tensor, draft: Draft, sampler: RowSampler) -> Accepted:
    # logits: [m + 1, vocab]; p[j] is the request's sampling distribution at position j, over the full vocabulary.
    import torch

    m, vocab = len(draft.token_ids), logits.shape[-1]
    params, gen = sampler.params, sampler.generator
    probs, ids = filtered_distribution(logits, [params] * (m + 1), params.logprobs or 0)  # [m + 1, K]
    probs = probs / probs.sum(dim=-1, keepdim=True)
    p = torch.zeros(m + 1, vocab).scatter_(1, ids, probs)  # [m + 1, vocab]
    tokens: list[int] = []
    for j, d in enumerate(draft.token_ids):
        q = draft.probs[j].float() if draft.probs is not None else _one_hot(d, vocab)
        if torch.rand((), generator=gen) * q[d] < p[j, d]:  # u < p(d) / q(d), without dividing by a tiny q
            tokens.append(d)
            continue
        residual = torch.clamp(p[j] - q, min=0.0)
        if float(residual.sum()) <= 0.0:  # p <= q everywhere (float round-off): p itself is the residual
            residual = p[j]
        tokens.append(int(torch.multinomial(residual, 1, generator=gen)))
        return Accepted(tokens, m, j, _entries(p, tokens, params.logprobs))
    tokens.append(int(torch.multinomial(p[m], 1, generator=gen)))
    return Accepted(tokens, m, m, _entries(p, tokens, params.logprobs))


def _one_hot(token: int, vocab: int) -> Tensor:
    import torch

    q = torch.zeros(vocab)
    q[token] = 1.0
    return q


def _entries(p: Tensor, tokens: list[int], top_n: int | None) -> list[TokenLogprobs] | None:
    """Logprobs of emitted tokens under the distribution sampled from (as ``sampling.sample`` reports them)."""
    if top_n is None:
        return None
    logp = p[: len(tokens)].log()
    return [from_log_distribution(logp[j], t, top_n) for j, t in enumerate(tokens)]
