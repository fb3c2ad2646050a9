"""A mixture-of-experts family's configuration (torch-free): what its MoE layers route with and compute, read from
config.json by the family (models/families/qwen3_moe.py, mixtral.py, gpt_oss.py), plus the format the checkpoint
holds the experts in (``expert_format``, found by the loader from the tensors: models/moe_checkpoint.py), and how
the family's checkpoints name the experts (``ExpertNames``).

Routing, as transformers' routers compute it: ``softmax_topk`` (Qwen3-MoE, Mixtral: a float32 softmax over every
expert, the top k, renormalised when ``normalize``) or ``topk_softmax`` (gpt-oss: the top k logits, a softmax over
them in the compute dtype); ``weights_in_dtype``: the routing weights are rounded to the compute dtype (Qwen3-MoE,
gpt-oss) or kept in float32 (Mixtral). The experts' activation is ``g' * sigmoid(alpha * g') * (u' + up_offset)``
with g' = min(gate, limit), u' = clamp(up, -limit, limit): SwiGLU (1, inf, 0) or gpt-oss's (1.702, 7, 1).

Example::

    moe = MoeConfig(num_experts=128, experts_per_token=8, intermediate_size=768, routing=SOFTMAX_TOPK,
                    normalize=True, weights_in_dtype=True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from neuronpack.errors import UnsupportedModelError

MOE = "moe"  # the FFN kind of a mixture-of-experts layer (ModelConfig.ffn_types)
SOFTMAX_TOPK, TOPK_SOFTMAX = "softmax_topk", "topk_softmax"
EXPERT_FORMATS = ("float", "int8", "mxfp4")


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    experts_per_token: int
    intermediate_size: int  # each expert's
    routing: str  # SOFTMAX_TOPK or TOPK_SOFTMAX
    normalize: bool  # renormalise the top-k probabilities (SOFTMAX_TOPK)
    weights_in_dtype: bool  # routing weights rounded to the compute dtype (else float32)
    router_bias: bool = False
    expert_bias: bool = False
    alpha: float = 1.0
    limit: float = math.inf
    up_offset: float = 0.0
    expert_format: str = "float"  # how the checkpoint holds the experts: float, int8 (per channel) or mxfp4


@dataclass(frozen=True)
class ExpertNames:
    """How a family names one block's experts. ``gate`` / ``up`` / ``down``: the per-expert linears;
    ``interleaved``: fused gate_up rows (or columns) alternate gate and up; ``transposed``: fused tensors stored for
    ``x @ W`` ([E, H, 2I], [E, I, H])."""

    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"
    interleaved: bool = False
    transposed: bool = False


def experts_per_token(hf: dict[str, Any], experts: int) -> int:
    """config.json's top k (``num_experts_per_tok``; gpt-oss's releases also say ``experts_per_token``), checked."""
    k = int(hf.get("num_experts_per_tok") or hf.get("experts_per_token") or 0)
    if not 0 < k <= experts:
        raise UnsupportedModelError(f"num_experts_per_tok {k} is not between 1 and the {experts} experts",
                                    where="config.json num_experts_per_tok", fix="check the checkpoint's config")
    return k
