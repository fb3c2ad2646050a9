"""The mixture-of-experts FFN of the MoE families (Qwen3-MoE, Mixtral, gpt-oss): a router, then the routed experts,
which read and compute only the experts each token chose (torch.ops.neuronpack.routed_experts, kernels/moe.cpp; its
formula in torch ops, models/moe_reference.py, for graphs exported without the kernels).

The experts' weights are stacked as the kernel takes them, whatever the checkpoint's layout (models/moe_checkpoint.py
reads them): ``experts.gate_up.weight`` [E, 2I, H] (gate rows, then up rows) and ``experts.down.weight`` [E, H, I],
float in the compute dtype, int8 with ``.scale`` [E, rows] float32 (per channel), or MXFP4 (blocks uint8
[E, rows, K / 32, 16] with ``.scale`` the E8M0 bytes [E, rows, K / 32]: 4.25 bits per weight, as gpt-oss ships);
``.bias`` [E, rows] float32 where the family has expert biases. The router is a linear (``gate`` or ``router``: the
family's checkpoint name), float unless the checkpoint quantized it.

Example::

    ffn = SparseMoE(cfg, "model.layers.0.mlp", frozenset(), "gate")   # meta weights until loaded
    y = ffn(x)                                                       # x [B, T, H] -> [B, T, H]
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from neuronpack.models.config import ModelConfig
from neuronpack.models.layers import make_linear
from neuronpack.models.moe_config import TOPK_SOFTMAX, MoeConfig
from neuronpack.models.moe_reference import routed_experts_reference


class StackedProjection(nn.Module):
    """One projection of every expert: ``weight`` [E, rows, K] (float or int8) or MXFP4 blocks [E, rows, K / 32, 16];
    ``scale`` [E, rows] float32 (int8) or the E8M0 bytes [E, rows, K / 32] (MXFP4); ``bias`` [E, rows] float32."""

    def __init__(self, experts: int, rows: int, k: int, fmt: str, bias: bool) -> None:
        super().__init__()
        if fmt == "mxfp4":
            self.register_buffer("weight", torch.empty(experts, rows, k // 32, 16, dtype=torch.uint8))
            self.register_buffer("scale", torch.empty(experts, rows, k // 32, dtype=torch.uint8))
        elif fmt == "int8":
            self.register_buffer("weight", torch.empty(experts, rows, k, dtype=torch.int8))
            self.register_buffer("scale", torch.empty(experts, rows, dtype=torch.float32))
        else:
            self.weight = nn.Parameter(torch.empty(experts, rows, k))
            self.scale = None
        self.register_buffer("bias", torch.empty(experts, rows, dtype=torch.float32) if bias else None)


class RoutedExperts(nn.Module):
    """The experts of one MoE layer (``gate_up``, ``down``): x [N, H], each row's expert ids and weights [N, k]
    -> [N, H]. ``kernel``: run neuronpack's kernel (models/linear_kernels.py flags it), else the torch reference."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        moe: MoeConfig = cfg.moe
        e, h, i = moe.num_experts, cfg.hidden_size, moe.intermediate_size
        self.gate_up = StackedProjection(e, 2 * i, h, moe.expert_format, moe.expert_bias)
        self.down = StackedProjection(e, h, i, moe.expert_format, moe.expert_bias)
        # no limit goes to the kernel as 0: an AOTInductor package cannot hold an inf argument
        self.activation = (moe.alpha, moe.limit if moe.limit < math.inf else 0.0, moe.up_offset)
        self.kernel = False

    def forward(self, x: Tensor, expert_ids: Tensor, expert_weights: Tensor) -> Tensor:
        args = (x, expert_ids, expert_weights, self.gate_up.weight, self.down.weight, self.gate_up.scale,
                self.down.scale, self.gate_up.bias, self.down.bias, *self.activation)
        if self.kernel and x.dtype in (torch.float32, torch.bfloat16):
            return torch.ops.neuronpack.routed_experts(*args)
        return routed_experts_reference(*args)


class SparseMoE(nn.Module):
    """A MoE layer's FFN at ``prefix``: the router (``router_name``: ``gate`` or ``router``, with a bias where the
    family has one; int8 when its prefix is in ``int8``) picks each token's experts and their weights as the family's
    transformers router does (models/moe_config.py), then ``experts`` computes them. ``forward(x, lora)``:
    x [B, T, H] -> [B, T, H] (no LoRA on experts)."""

    def __init__(self, cfg: ModelConfig, prefix: str, int8: frozenset[str], router_name: str = "gate") -> None:
        super().__init__()
        moe: MoeConfig = cfg.moe
        self.router_name, self.moe = router_name, moe
        router = make_linear(cfg.hidden_size, moe.num_experts, moe.router_bias, f"{prefix}.{router_name}" in int8)
        setattr(self, router_name, router)
        self.experts = RoutedExperts(cfg)

    def route(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """rows [N, H] -> (expert ids [N, k] int64, routing weights [N, k])."""
        moe = self.moe
        logits = getattr(self, self.router_name)(rows)  # [N, E] in the compute dtype
        if moe.routing == TOPK_SOFTMAX:  # gpt-oss: a softmax over the top k logits, in their dtype
            top, ids = torch.topk(logits, moe.experts_per_token, dim=-1)
            return ids, torch.softmax(top, dim=-1, dtype=top.dtype)
        weights, ids = torch.topk(torch.softmax(logits.float(), dim=-1), moe.experts_per_token, dim=-1)
        if moe.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids, weights.to(logits.dtype) if moe.weights_in_dtype else weights

    def forward(self, x: Tensor, lora: Tensor | None = None) -> Tensor:
        b, t, h = x.shape
        rows = x.reshape(b * t, h)
        ids, weights = self.route(rows)
        return self.experts(rows, ids, weights).view(b, t, h)
