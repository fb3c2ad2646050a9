"""What a plan's reader must know beside its figures: what was not planned and why, where the budget was not spent,
what the plan trades for what, and which planned buckets nothing here has verified.

Example::

    plan_notes(rules, demand, traffic, current=report.current.padding, planned=report.planned.padding,
               planned_context=(400, 408, 8192), planned_graphs=14, cost=report.cost, budget=14, capped=(), cap=64)
    # ("the plan pads 2.4x the KV positions per generated token of the current one ...",)
"""

from __future__ import annotations

from neuronpack.planner.cost import CostModel
from neuronpack.planner.demand import Demand, Padding
from neuronpack.planner.frameworks import FrameworkRules
from neuronpack.traffic import Traffic

FLASH_SOURCE = "aws-neuron/nki-library, branch 2.29_release"


def plan_notes(rules: FrameworkRules, demand: Demand, traffic: Traffic, *, current: Padding, planned: Padding,
               planned_context: tuple[int, ...], planned_graphs: int, cost: CostModel, budget: int,
               capped: tuple[str, ...], cap: int) -> tuple[str, ...]:
    """The notes of a plan, in the order a reader needs them: ``current`` and ``planned`` are the two plans'
    padding; ``capped`` the kinds whose bucket count reached ``cap``."""
    if rules.framework == "torch":
        longer = sum(r.prompt_tokens - (r.cached_tokens or 0) > rules.prefill_chunk for r in traffic.records)
        return (f"the portable backend pads nothing (its graphs take any length and batch): nothing to plan; its "
                f"prefill chunk is {rules.prefill_chunk} tokens (the largest context bucket), and {longer} of "
                f"{len(traffic.records)} prompts are longer and prefill in chunks",)
    notes = []
    if not demand.token_generation:
        notes.append("no request has completion_tokens > 1: token-generation buckets kept as they are")
    if rules.batch.planned and not demand.batch:
        notes.append("no request has batch: batch buckets kept as they are")
    if rules.framework == "nxd" and not rules.batch.planned:
        notes.append("NxDI batch buckets are planned when the recipe sets neuron_overrides.token_generation_batches")
    if capped:
        notes.append(f"a budget of {budget} graphs is more than a plan spends: each kind gets at most {cap} buckets "
                     f"({', '.join(capped)} reached that), so the plan uses {planned_graphs} graphs")
    notes += _kv_tradeoff(current, planned, cost)
    notes += _unverified_flash_attention(rules, planned_context)
    return tuple(notes)


def _kv_tradeoff(current: Padding, planned: Padding, cost: CostModel) -> list[str]:
    """A plan that pads more KV positions than the current one does so because the cost model priced them low."""
    now, new = current.kv_per_token, planned.kv_per_token
    if new <= now:
        return []
    more = f"{new / now:.1f}x the" if now else "more"
    prompt = current.prompt_mean - planned.prompt_mean
    gain = (f"for {prompt:.1f} fewer padded prompt tokens per request" if prompt > 0 else
            "to fit the budget")
    return [f"the plan pads {more} KV positions per generated token of the current one ({new:.1f} vs {now:.1f}) "
            f"{gain}: one padded KV position weighs {cost.kv_weight:.3g} of a padded prompt token in the cost model "
            f"({cost.shape_from}); --kv-weight W weighs it otherwise (a larger W keeps more KV buckets)"]


def _unverified_flash_attention(rules: FrameworkRules, planned_context: tuple[int, ...]) -> list[str]:
    """Planned context buckets that NxDI's unsharded flash-attention kernel runs, at lengths NxDI itself never picks
    (its automatic buckets are powers of two): the kernel's public source tiles any length, but no such bucket has
    been compiled on a device for neuronpack."""
    start = rules.flash_attention_from
    odd = [b for b in planned_context if start is not None and b >= start and b & (b - 1)]
    if not odd:
        return []
    return [f"context bucket{'s' if len(odd) > 1 else ''} {', '.join(map(str, odd))} run NxD Inference's unsharded "
            f"flash-attention kernel (get_flash_attention_strategy at LNC 1: lengths from {start}), nkilib's "
            f"attention_cte, at lengths NxDI's automatic buckets never take (powers of two): its public source "
            f"({FLASH_SOURCE}) has no length rule (128-token query groups and 512-token key tiles, the last of "
            "each partial; its tests run lengths such as 16400), but no bucket of such a length has been compiled on "
            "a device for neuronpack: unverified"]
