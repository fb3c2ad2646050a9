"""Each framework's bucket rules, read from a recipe: what a bucket may be, how a request is routed, how many graphs
a plan compiles, and the plan the recipe compiles today.

- nxd (NxD Inference 0.9, models/config.py, modules/autobucketing.py, models/model_wrapper.py): context buckets up
  to max_context_length, token-generation buckets up to seq_len, routed by ``get_target_bucket``'s first fit (the
  first bucket with length + speculation_length < bucket; a length equal to the largest uses it). With sequence
  parallelism (on in every neuronpack nxd config) a context bucket must be a multiple of tp_degree
  (``validate_sequence_parallel``); at LNC 2 (trn2 / trn3) flash attention runs only on context lengths that are
  multiples of 256 below 1024 and of 512 from 1024 (``get_flash_attention_strategy``), so planned buckets keep to
  those. At LNC 1 (trn1, inf2) the same function gives context lengths from 4096 (from 512 with
  ``attn_kernel_enabled``) the unsharded flash-attention kernel, nkilib's ``attention_cte``, which has no length rule
  in its public source (aws-neuron/nki-library, branch 2.29_release: 128-token query groups, 512-token key tiles,
  the last of each partial) and is named by the plan's notes (``flash_attention_from``). Batch buckets
  (``token_generation_batches``) are planned when the recipe turns them on in
  [neuron_overrides]; NxDI then routes (batch, length) by ``_get_batch_and_seq_bucket``: smallest fitting, lengths
  by <=. Graphs: context buckets + token-generation buckets x batch buckets.
- tnx (transformers-neuronx): the smallest bucket >= length, for both kinds.
- vneuron (the SDK 2.31+ plugin, vllm-neuron 0.21): prefill chunks of at most max_num_batched_tokens padded to the
  smallest ``num_batched_tokens_buckets`` entry that holds them, the largest equal to max_num_batched_tokens;
  decode batches to the smallest ``num_seqs_buckets`` entry (the largest max_num_seqs); decode KV lengths to the
  smallest ``decode_context_length_buckets`` entry, whole KV blocks (the pinned worker compiles only the listed
  ones, ``_decode_compile_targets``, so the largest is max_model_len). Graphs: prefill buckets + batch x KV buckets.
- torch (portable): graphs take any length and batch, nothing is padded; the largest context bucket is the prefill
  chunk. Nothing to plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from neuronpack.errors import RecipeError
from neuronpack.recipe import Recipe

FRAMEWORKS = ("nxd", "tnx", "vneuron", "torch")


@dataclass(frozen=True)
class Dimension:
    """One bucketed dimension: its maximum, what a bucket may be and how lengths route to it."""

    name: str  # "context", "token_generation" or "batch"
    maximum: int
    strict: bool  # NxDI's first fit (length < bucket) vs smallest bucket >= length
    round_up: Callable[[int], int]  # the smallest admissible bucket >= a value
    current: tuple[int, ...]
    planned: bool = True  # False: kept as the recipe has it


@dataclass(frozen=True)
class FrameworkRules:
    framework: str
    context: Dimension
    token_generation: Dimension
    batch: Dimension
    speculation: int  # added to every decode length (NxDI's fused speculation routes length + speculation_length)
    prefill_chunk: int | None  # prompts longer than this are prefilled in chunks of it
    prefill_skips_cached: bool  # a prefill computes only the prompt tokens a prefix cache did not hold
    max_prompt: int
    flash_attention_from: int | None = None  # nxd at LNC 1: context buckets from here run NxDI's unsharded kernel

    def graphs(self, context: int, token_generation: int, batch: int) -> int:
        if self.framework == "torch":
            return 0
        return context + token_generation * batch


def framework_rules(recipe: Recipe, framework: str) -> FrameworkRules:
    """The rules of ``framework`` for this recipe (RecipeError for what the framework cannot build)."""
    if framework not in FRAMEWORKS:
        raise RecipeError(f"cannot plan buckets for framework {framework!r}", where="target.framework",
                          fix=f"pass --framework with one of {', '.join(FRAMEWORKS)}")
    return {"nxd": _nxd, "tnx": _tnx, "vneuron": _vneuron, "torch": _torch}[framework](recipe)


def multiple_of(step: int) -> Callable[[int], int]:
    return lambda value: -(-value // step) * step


# --- private ---------------------------------------------------------------------------------------------------------
def _nxd(recipe: Recipe) -> FrameworkRules:
    t, plan, overrides = recipe.target, recipe.bucket_plan(), recipe.neuron_overrides
    lnc2 = int(overrides.get("logical_nc_config", 2 if recipe.instance_for("nxd") in ("trn2", "trn3") else 1)) == 2
    sequence_parallel = bool(overrides.get("sequence_parallel_enabled", True))
    step = t.tp_degree if sequence_parallel else 1

    def context_round_up(value: int) -> int:
        value = multiple_of(step)(value)
        while lnc2 and value % (512 if value >= 1024 else 256):
            value = multiple_of(step)(value + 1)
        return value

    batches = overrides.get("token_generation_batches")
    spec = recipe.speculation.length if recipe.speculation is not None else 0
    # get_flash_attention_strategy at LNC 1 without context parallelism: the unsharded kernel from 4096 tokens, or
    # from 512 when attn_kernel_enabled is set; never when it is False
    kernel = overrides.get("attn_kernel_enabled")
    flash = None if lnc2 or kernel is False or int(overrides.get("cp_degree", 1)) > 1 else 512 if kernel else 4096
    batch_current = tuple(sorted({*batches, t.batch_size})) if batches else (t.batch_size,)
    return FrameworkRules(
        "nxd", Dimension("context", plan.max_context_length, True, context_round_up, plan.context),
        # NxDI routes decode lengths by < without batch bucketing, by <= with it (_get_batch_and_seq_bucket)
        Dimension("token_generation", plan.seq_len, not batches, int, plan.token_generation),
        Dimension("batch", t.batch_size, False, int, batch_current, planned=bool(batches)),
        speculation=spec, prefill_chunk=None, prefill_skips_cached=False, max_prompt=plan.max_context_length,
        flash_attention_from=flash)


def _tnx(recipe: Recipe) -> FrameworkRules:
    plan = recipe.bucket_plan()
    return FrameworkRules(
        "tnx", Dimension("context", plan.max_context_length, False, int, plan.context),
        Dimension("token_generation", plan.seq_len, False, int, plan.token_generation),
        Dimension("batch", recipe.target.batch_size, False, int, (recipe.target.batch_size,), planned=False),
        speculation=0, prefill_chunk=None, prefill_skips_cached=False, max_prompt=plan.max_context_length)


def _vneuron(recipe: Recipe) -> FrameworkRules:
    from neuronpack.backends.vneuron.config import plugin_config

    config = plugin_config(recipe, {})
    neuron = config.neuron_config
    decode = tuple(neuron.get("decode_context_length_buckets") or (config.max_model_len,))
    return FrameworkRules(
        "vneuron",
        Dimension("context", config.max_num_batched_tokens, False, int, tuple(neuron["num_batched_tokens_buckets"])),
        Dimension("token_generation", config.max_model_len, False, multiple_of(config.block_size), decode),
        Dimension("batch", config.max_num_seqs, False, int, tuple(neuron["num_seqs_buckets"])),
        speculation=0, prefill_chunk=config.max_num_batched_tokens, prefill_skips_cached=True,
        max_prompt=config.max_model_len - 1)


def _torch(recipe: Recipe) -> FrameworkRules:
    plan = recipe.bucket_plan()
    t = recipe.target
    return FrameworkRules(
        "torch", Dimension("context", plan.max_context_length, False, int, plan.context, planned=False),
        Dimension("token_generation", plan.seq_len, False, int, plan.token_generation, planned=False),
        Dimension("batch", t.batch_size, False, int, (t.batch_size,), planned=False),
        speculation=0, prefill_chunk=plan.context[-1], prefill_skips_cached=True, max_prompt=plan.seq_len - 1)
