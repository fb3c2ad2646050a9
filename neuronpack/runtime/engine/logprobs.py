"""Log-probabilities returned to clients: of sampled tokens (``logprobs``) and of prompt tokens (``echo``).

Which distribution (vLLM's ``--logprobs-mode processed_logprobs``, chosen because it is the one tokens are actually
drawn from): a sampled row reports ``log_softmax(logits / temperature)`` restricted to its top-k / top-p / global_topk
candidates and renormalised (tokens outside get ``-inf``, sent as -9999.0 like OpenAI); a greedy row (temperature 0)
reports ``log_softmax(logits)``, as vLLM does for greedy requests. Prompt tokens never go through sampling: their
logprobs are ``log_softmax(logits)`` of the position before them (vLLM: processed and raw are the same there).

Example::

    entries = prompt_logprobs(logits, prompt_ids=[5, 9, 2], top_n=1)   # logits: [3, vocab] float32
    entries[0] is None; entries[1].token_id == 9; entries[1].top[0]   # (best id, its logprob)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs (and OpenAI's chat top_logprobs limit)


@dataclass(frozen=True)
class TokenLogprobs:
    """One position: the chosen (or given) token's logprob and the ``top_n`` best tokens there, best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def from_log_distribution(logp: Tensor, token_id: int, top_n: int) -> TokenLogprobs:
    """Entry for ``token_id`` under one row's log-distribution ``logp`` [vocab] (float32, may hold -inf)."""
    import torch

    top: tuple[tuple[int, float], ...] = ()
    if top_n > 0:
        values, ids = torch.topk(logp, min(top_n, logp.shape[-1]))
        top = tuple(zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprobs(int(token_id), float(logp[token_id]), top)


def prompt_logprobs(logits: Tensor, prompt_ids: Sequence[int], top_n: int) -> list[TokenLogprobs | None]:
    """Per prompt token: None for the first (nothing predicts it), then each token's logprob given the ones before.

    logits: float32 [len(prompt), vocab], row i predicting token i + 1 (the last row predicts the first output).
    """
    import torch

    out: list[TokenLogprobs | None] = [None]
    if len(prompt_ids) < 2:
        return out
    logp = torch.log_softmax(logits[: len(prompt_ids) - 1].float(), dim=-1)  # [T-1, vocab]
    targets = torch.tensor(list(prompt_ids[1:]), dtype=torch.long)
    chosen = logp.gather(1, targets[:, None])[:, 0].tolist()
    if top_n > 0:
        values, ids = torch.topk(logp, min(top_n, logp.shape[-1]), dim=-1)
        tops = [tuple(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    else:
        tops = [()] * len(chosen)
    out.extend(TokenLogprobs(t, lp, top) for t, lp, top in zip(prompt_ids[1:], chosen, tops, strict=True))
    return out
