"""Routed experts (mixture of experts) in torch ops: the formula of neuronpack's kernel, for graphs exported without
it (export-only artifacts) and for tests.

``routed_experts_reference`` computes what ``torch.ops.neuronpack.routed_experts`` (kernels/moe.cpp) computes, with
the same arguments: x [T, H], each token's k expert ids and weights, the experts' stacked weights (gate rows then up
rows ``[E, 2I, H]``, down ``[E, H, I]``; float, int8 with per-channel scales, or MXFP4 blocks with E8M0 scales),
optional biases, and the activation's alpha, limit and up offset (SwiGLU: 1, no limit (inf or 0), 0; gpt-oss: 1.702,
7, 1).
Few (token, choice) pairs (T * k below the number of experts: a decode step) gather only the chosen experts'
weights; more run every expert on every token and keep the routed results (a prefill reads every expert anyway; the
kernel's GEMMs compute only the routed rows). Rounding as transformers' experts in x's dtype (see moe.cpp).

Example::

    y = routed_experts_reference(x, ids, weights, gate_up, down)   # x [T, H], ids / weights [T, k] -> [T, H]
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from neuronpack.models import mxfp4


def routed_experts_reference(x: Tensor, expert_ids: Tensor, expert_weights: Tensor, gate_up: Tensor, down: Tensor,
                             gate_up_scale: Tensor | None = None, down_scale: Tensor | None = None,
                             gate_up_bias: Tensor | None = None, down_bias: Tensor | None = None,
                             alpha: float = 1.0, limit: float = math.inf, up_offset: float = 0.0) -> Tensor:
    """x [..., H], expert_ids / expert_weights [..., k] -> [..., H] in x's dtype (see the module docstring)."""
    h = x.shape[-1]
    rows = x.reshape(-1, h)
    ids = expert_ids.reshape(rows.shape[0], -1)
    weights = expert_weights.reshape(rows.shape[0], -1).float()
    order = ids.argsort(-1)  # each token's experts in ascending order: the order transformers adds them in
    ids, weights = ids.gather(-1, order), weights.gather(-1, order)
    gate = (gate_up, gate_up_scale, gate_up_bias)
    down_proj = (down, down_scale, down_bias)
    act = (alpha, limit, up_offset)
    if _statically_below(rows.shape[0] * ids.shape[1], gate_up.shape[0]):
        y = _gathered(rows, ids, weights, gate, down_proj, act)
    else:
        y = _every_expert(rows, ids, weights, gate, down_proj, act)
    return y.to(x.dtype).view(x.shape)


def activation(gate_up: Tensor, alpha: float, limit: float, up_offset: float) -> Tensor:
    """[..., 2I] (gate then up) -> [..., I]: g' * sigmoid(alpha * g') * (u' + up_offset), g' = min(g, limit),
    u' = clamp(u, -limit, limit) (no clamp for a limit of 0 or inf)."""
    i = gate_up.shape[-1] // 2
    g, u = gate_up[..., :i], gate_up[..., i:]
    if 0 < limit < math.inf:  # 0 or inf: no limit
        g, u = g.clamp(max=limit), u.clamp(-limit, limit)
    return g / (1 + torch.exp(-alpha * g)) * (u + up_offset)


def expert_matrix(weight: Tensor, scale: Tensor | None) -> Tensor:
    """Stacked (or gathered) expert weights [..., rows, K] as float32: float as is, int8 times its per-channel
    scale, MXFP4 blocks [..., rows, K / 32, 16] with their E8M0 scales dequantized."""
    if weight.dtype == torch.uint8:
        return mxfp4.dequantize(weight, scale, torch.float32)
    if weight.dtype == torch.int8:
        return weight.float() * scale.float().reshape(*weight.shape[:-1], 1)
    return weight.float()


def _rounded(v: Tensor, dtype: torch.dtype) -> Tensor:
    return v.to(dtype).float()


def _gathered(rows: Tensor, ids: Tensor, weights: Tensor, gate: tuple, down: tuple, act: tuple) -> Tensor:
    """Only the chosen experts' weights, gathered per (token, choice): [T, k, ...]."""
    dtype = rows.dtype

    def project(x: Tensor, proj: tuple) -> Tensor:  # x [T, k?, K] -> [T, k, rows] float32, + bias, rounded
        weight, scale, bias = proj
        w = expert_matrix(weight[ids], None if scale is None else scale[ids])  # [T, k, rows, K]
        y = torch.einsum("tkn,tkon->tko", x.float().expand(*ids.shape, x.shape[-1]), w)
        return _rounded(y + bias[ids].float() if bias is not None else y, dtype)

    hidden = _rounded(activation(project(rows[:, None, :], gate), *act), dtype)  # [T, k, I]
    ys = project(hidden, down)  # [T, k, H]
    acc = torch.zeros_like(ys[:, 0])
    for j in range(ids.shape[1]):  # in expert order, each sum rounded
        acc = _rounded(acc + _rounded(ys[:, j] * weights[:, j, None], dtype), dtype)
    return acc


def _every_expert(rows: Tensor, ids: Tensor, weights: Tensor, gate: tuple, down: tuple, act: tuple) -> Tensor:
    """Every expert on every token, in expert order, each token keeping the experts it chose."""
    dtype = rows.dtype
    x = rows.float()
    acc = torch.zeros_like(x)

    def project(v: Tensor, proj: tuple, e: int) -> Tensor:
        weight, scale, bias = proj
        y = v @ expert_matrix(weight[e], None if scale is None else scale[e]).T
        return _rounded(y + bias[e].float() if bias is not None else y, dtype)

    for e in range(down[0].shape[0]):
        chosen = ids == e  # [T, k]
        ys = project(_rounded(activation(project(x, gate, e), *act), dtype), down, e)
        w = (weights * chosen).sum(-1, keepdim=True)
        acc = torch.where(chosen.any(-1, keepdim=True), _rounded(acc + _rounded(ys * w, dtype), dtype), acc)
    return acc


def _statically_below(m, limit: int) -> bool:
    """``m < limit`` for a plain size, or a symbolic one (a dynamic batch) when provable for every value."""
    if isinstance(m, int):
        return m < limit
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(m < limit)
