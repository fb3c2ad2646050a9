"""Qwen3-MoE (``Qwen3MoeForCausalLM``, e.g. Qwen3-30B-A3B): Qwen3's attention (q / k norms) and, in every layer
that is neither in ``mlp_only_layers`` nor off the ``decoder_sparse_step``, a mixture of ``num_experts`` experts of
``moe_intermediate_size``, ``num_experts_per_tok`` per token, chosen by a float32 softmax over the router's logits
and renormalised when ``norm_topk_prob`` (the weights then rounded to the compute dtype), as transformers'
Qwen3MoeTopKRouter; the other layers keep Qwen3's dense MLP of ``intermediate_size``.

Example::

    cfg = FAMILY.config_from_hf(hf)      # hf: a Qwen3-MoE config.json dict
    cfg.ffn_kind(0), cfg.moe.num_experts  # ("moe", 128)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from neuronpack.models.config import DENSE, ModelConfig
from neuronpack.models.families.moe import MoeFamily
from neuronpack.models.families.qwen3 import Qwen3Family
from neuronpack.models.moe_config import MOE, SOFTMAX_TOPK, MoeConfig, experts_per_token


class Qwen3MoeFamily(MoeFamily, Qwen3Family):
    name = "qwen3_moe"

    def config_from_hf(self, hf: dict[str, Any], *, max_seq_len: int | None = None) -> ModelConfig:
        cfg = super().config_from_hf(hf, max_seq_len=max_seq_len)
        experts = int(hf.get("num_experts") or hf.get("num_local_experts") or 0)
        moe = MoeConfig(num_experts=experts, experts_per_token=experts_per_token(hf, experts),
                        intermediate_size=int(hf["moe_intermediate_size"]), routing=SOFTMAX_TOPK,
                        normalize=bool(hf.get("norm_topk_prob", False)), weights_in_dtype=True)
        return dataclasses.replace(cfg, moe=moe, ffn_types=self.ffn_types(hf, cfg.num_layers))

    def ffn_types(self, hf: dict[str, Any], layers: int) -> tuple[str, ...]:
        """transformers' rule: a layer is sparse unless listed in ``mlp_only_layers``, when (index + 1) is a
        multiple of ``decoder_sparse_step``."""
        dense_only, step = set(hf.get("mlp_only_layers") or ()), int(hf.get("decoder_sparse_step") or 1)
        return tuple(MOE if i not in dense_only and (i + 1) % step == 0 else DENSE for i in range(layers))


FAMILY = Qwen3MoeFamily()
