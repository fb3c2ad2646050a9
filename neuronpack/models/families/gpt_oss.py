"""gpt-oss (``GptOssForCausalLM``): attention with biases and per-head sinks (one learned logit per head that every
query sees, taking probability mass without a value), sliding-window and full layers alternating (``layer_types``,
``sliding_window``), YaRN rope (models/rope.py), RMSNorms scaled in float32 (those two layers:
families/gpt_oss_layers.py), and in every layer a mixture of ``num_local_experts`` experts of ``intermediate_size``:
the router (with a bias) takes the top k logits and a softmax over them, the experts (with biases) run gpt-oss's
clamped SwiGLU (``swiglu_alpha``, ``swiglu_limit``, up + 1), as transformers' GptOssTopKRouter / GptOssExperts. Its
checkpoints keep the experts fused and transposed (transformers) or in MXFP4 (the released layout), both read by
models/moe_checkpoint.py, MXFP4 kept as it is.

Example::

    cfg = FAMILY.config_from_hf(hf)              # hf: a gpt-oss config.json dict
    cfg.layer_kind(0), cfg.rope["rope_type"]      # ("sliding_attention", "yarn")
"""

from __future__ import annotations

from typing import Any

from neuronpack.models.config import FULL, SLIDING, ModelConfig, rope_parameters, shapes
from neuronpack.models.families.llama import LlamaFamily
from neuronpack.models.families.moe import MoeFamily
from neuronpack.models.moe_config import TOPK_SOFTMAX, ExpertNames, MoeConfig, experts_per_token

# transformers' GptOssConfig defaults for a config.json without them
DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096, "rope_theta": 150000.0}


class GptOssFamily(MoeFamily, LlamaFamily):
    name = "gpt_oss"
    router = "router"
    expert_names = ExpertNames(interleaved=True, transposed=True)

    def config_from_hf(self, hf: dict[str, Any], *, max_seq_len: int | None = None) -> ModelConfig:
        layers = int(hf["num_hidden_layers"])
        experts = int(hf["num_local_experts"])
        kinds = tuple(hf.get("layer_types") or (SLIDING if (i + 1) % 2 else FULL for i in range(layers)))
        bias = bool(hf.get("attention_bias", True))
        has_rope = hf.get("rope_parameters") or hf.get("rope_scaling")
        rope = rope_parameters(hf) if has_rope else rope_parameters({**hf, "rope_parameters": DEFAULT_ROPE})
        moe = MoeConfig(num_experts=experts, experts_per_token=experts_per_token(hf, experts),
                        intermediate_size=int(hf["intermediate_size"]), routing=TOPK_SOFTMAX, normalize=False,
                        weights_in_dtype=True, router_bias=True, expert_bias=True,
                        alpha=float(hf.get("swiglu_alpha", 1.702)), limit=float(hf.get("swiglu_limit", 7.0)),
                        up_offset=1.0)
        return ModelConfig(**shapes(hf, "gpt_oss", self.name), qkv_bias=bias, o_bias=bias, rope=rope,
                           sliding_window=int(hf["sliding_window"]) if SLIDING in kinds else None,
                           layer_types=kinds, moe=moe, ffn_types=self.ffn_types(hf, layers))

    def norm(self, cfg: ModelConfig, dim: int):
        from neuronpack.models.families.gpt_oss_layers import FloatScaledRMSNorm

        return FloatScaledRMSNorm(dim, cfg.rms_norm_eps)

    def attention(self, cfg: ModelConfig, index: int, int8: frozenset[str]):
        from neuronpack.models.families.gpt_oss_layers import SinkAttention

        return SinkAttention(cfg, int8, f"model.layers.{index}.self_attn", window=cfg.window(cfg.layer_kind(index)))


FAMILY = GptOssFamily()
