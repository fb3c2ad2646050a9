"""Mixtral (``MixtralForCausalLM``): Llama's attention and, in every layer, ``num_local_experts`` SwiGLU experts of
``intermediate_size``, ``num_experts_per_tok`` per token, chosen by a float32 softmax over the router's logits,
renormalised, the weights kept in float32, as transformers' MixtralTopKRouter. Its checkpoints keep a block's
router and experts under ``block_sparse_moe`` (experts ``w1`` gate, ``w3`` up, ``w2`` down); transformers' fused
layout under ``mlp``.

Example::

    cfg = FAMILY.config_from_hf(hf)      # hf: a Mixtral config.json dict
"""

from __future__ import annotations

import dataclasses
from typing import Any

from neuronpack.models.config import ModelConfig
from neuronpack.models.families.llama import LlamaFamily
from neuronpack.models.families.moe import MoeFamily
from neuronpack.models.moe_config import SOFTMAX_TOPK, ExpertNames, MoeConfig, experts_per_token


class MixtralFamily(MoeFamily, LlamaFamily):
    name = "mixtral"
    blocks = ("block_sparse_moe",)
    expert_names = ExpertNames(gate="w1", up="w3", down="w2")

    def config_from_hf(self, hf: dict[str, Any], *, max_seq_len: int | None = None) -> ModelConfig:
        cfg = super().config_from_hf(hf, max_seq_len=max_seq_len)
        experts = int(hf["num_local_experts"])
        moe = MoeConfig(num_experts=experts, experts_per_token=experts_per_token(hf, experts),
                        intermediate_size=int(hf["intermediate_size"]), routing=SOFTMAX_TOPK, normalize=True,
                        weights_in_dtype=False)
        return dataclasses.replace(cfg, moe=moe, ffn_types=self.ffn_types(hf, cfg.num_layers))


FAMILY = MixtralFamily()
