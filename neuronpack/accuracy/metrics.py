"""Per-position agreement between an artifact's logits and the reference model's, and the pass/fail thresholds.

Both sides score the same token sequence teacher-forced (prompt + the reference's greedy continuation), so row ``i``
of each logits tensor is the distribution over token ``i + 1``. Figures:

- ``top1_agreement``: share of positions where both argmaxes agree;
- ``max_abs_diff`` / ``mean_abs_diff``: absolute logit difference over every position and vocabulary entry;
- ``kl_mean`` / ``kl_max``: KL(reference || artifact) per position, in nats;
- ``greedy_match``: how many of the reference's greedy continuation tokens the artifact reproduces before its first
  different choice (teacher-forced, this equals the match length of free-running greedy generation).

Example::

    stats = compare_logits(reference_logits, artifact_logits, continuation, prompt_len=12)
    summary = summarize([stats]); failures = THRESHOLDS["bfloat16"].failures(summary)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class PromptStats:
    name: str
    prompt_tokens: int
    continuation_tokens: int
    positions: int
    top1_agreement: float
    max_abs_diff: float
    mean_abs_diff: float
    kl_mean: float
    kl_max: float
    greedy_match: int
    truncated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_logits(reference: Tensor, artifact: Tensor, continuation: Sequence[int], *, prompt_len: int,
                   name: str = "prompt", truncated: bool = False) -> PromptStats:
    """Compare two [positions, vocab] logits tensors (positions = prompt_len + len(continuation) - 1)."""
    import torch

    ref, art = reference.double(), artifact.double()
    if ref.shape != art.shape:
        raise ValueError(f"logits shapes differ: reference {tuple(ref.shape)}, artifact {tuple(art.shape)}")
    diff = (ref - art).abs()
    ref_log, art_log = torch.log_softmax(ref, -1), torch.log_softmax(art, -1)
    kl = (ref_log.exp() * (ref_log - art_log)).sum(-1).clamp_min(0.0)  # rounding can dip a hair below zero
    agree = ref.argmax(-1) == art.argmax(-1)
    # Rows prompt_len-1 .. choose continuation tokens 0 ..: the artifact's choice vs the reference's token.
    chosen = art[prompt_len - 1:].argmax(-1).tolist()
    greedy = 0
    for mine, theirs in zip(chosen, continuation, strict=False):
        if mine != theirs:
            break
        greedy += 1
    return PromptStats(name=name, prompt_tokens=prompt_len, continuation_tokens=len(continuation),
                       positions=int(ref.shape[0]), top1_agreement=float(agree.double().mean()),
                       max_abs_diff=float(diff.max()), mean_abs_diff=float(diff.mean()),
                       kl_mean=float(kl.mean()), kl_max=float(kl.max()), greedy_match=greedy, truncated=truncated)


def summarize(stats: Sequence[PromptStats]) -> dict[str, Any]:
    """Figures over all prompts: means weighted by positions, maxima over everything, greedy match min / mean."""
    total = sum(s.positions for s in stats)
    weighted = {k: sum(getattr(s, k) * s.positions for s in stats) / total
                for k in ("top1_agreement", "mean_abs_diff", "kl_mean")}
    return {
        "prompts": len(stats),
        "positions": total,
        **weighted,
        "max_abs_diff": max(s.max_abs_diff for s in stats),
        "kl_max": max(s.kl_max for s in stats),
        "greedy_match_min": min(s.greedy_match for s in stats),
        "greedy_match_mean": sum(s.greedy_match for s in stats) / len(stats),
        "greedy_full_matches": sum(s.greedy_match == s.continuation_tokens for s in stats),
        "continuation_tokens": max(s.continuation_tokens for s in stats),
    }


@dataclass(frozen=True)
class Thresholds:
    """Limits a summary must meet; ``None`` means reported but not gated."""

    min_top1_agreement: float
    max_kl_mean: float
    max_kl: float | None = None
    max_abs_diff: float | None = None
    full_greedy_match: bool = False  # every prompt's continuation reproduced to the end

    def failures(self, summary: dict[str, Any]) -> list[str]:
        """One readable line per limit the summary breaks (empty: pass)."""
        out = []
        if summary["top1_agreement"] < self.min_top1_agreement:
            out.append(f"top-1 agreement {summary['top1_agreement']:.4f} < {self.min_top1_agreement}")
        if summary["kl_mean"] > self.max_kl_mean:
            out.append(f"mean KL {summary['kl_mean']:.3g} > {self.max_kl_mean:g}")
        if self.max_kl is not None and summary["kl_max"] > self.max_kl:
            out.append(f"max KL {summary['kl_max']:.3g} > {self.max_kl:g}")
        if self.max_abs_diff is not None and summary["max_abs_diff"] > self.max_abs_diff:
            out.append(f"max |logit diff| {summary['max_abs_diff']:.3g} > {self.max_abs_diff:g}")
        if self.full_greedy_match and summary["greedy_full_matches"] < summary["prompts"]:
            out.append(f"greedy continuation diverged (shortest match {summary['greedy_match_min']} of "
                       f"{summary['continuation_tokens']} tokens)")
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Calibrated on the tiny test models and SmolLM2-135M-Instruct (docs/eval.md has the measured figures): each limit
# sits several times above what a correct artifact of that precision shows, and far below what a broken one does.
THRESHOLDS: dict[str, Thresholds] = {
    "float32": Thresholds(min_top1_agreement=1.0, max_kl_mean=1e-6, max_kl=1e-5, max_abs_diff=1e-2,
                          full_greedy_match=True),
    "bfloat16": Thresholds(min_top1_agreement=0.9, max_kl_mean=0.02, max_kl=0.5),
    "float16": Thresholds(min_top1_agreement=0.95, max_kl_mean=5e-3, max_kl=0.2),
    "int8": Thresholds(min_top1_agreement=0.85, max_kl_mean=0.05, max_kl=1.0),
    "fp8": Thresholds(min_top1_agreement=0.75, max_kl_mean=0.1, max_kl=2.0),
}


def precision_class(torch_dtype: str, quantization: str | None) -> str:
    """The THRESHOLDS entry of an artifact: its weight quantization if any, else its compute dtype."""
    return quantization or torch_dtype  # recipe quantization.dtype is "int8" or "fp8"
