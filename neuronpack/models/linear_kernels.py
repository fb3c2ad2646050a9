"""Run a model's linears and decode attention on neuronpack's kernels (neuronpack/kernels: linear.cpp, attention.cpp).

A decode step is almost all linears over a few rows. BLAS reads their weights at ~55-60% of the machine's read
bandwidth at one row (MKL's GEMV and oneDNN's packed kernel alike, on one thread), and MKL slows down further from 2
rows up; neuronpack's kernel reads each plain weight once, front to back, and dots it with every row while it is in
the registers (SmolLM2-135M's 210 layer linears, 1 thread, Zen 4: bench/linears.py, docs/bench/linears.json).
The weights stay plain ``[out, in]`` tensors (in the loader's huge-page arena, models/weight_arena.py): no second,
packed copy.

``use_kernels(module)`` flags every float ``Linear``, ``Int8Linear`` and ``Attention`` of ``module`` (a loaded model,
or the meta-device structure a graph is traced from: the flag is what export records, as calls to the ops by name).
A flagged ``Attention`` runs ``torch.ops.neuronpack.decode_attention`` for one token per row with a cache (a decode
step); other steps keep torch ops.

Example::

    use_kernels(model)           # registers torch.ops.neuronpack.* (building them on first use), flags the linears
    logits = model(tokens)       # the linears run torch.ops.neuronpack.linear / linear_int8
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from neuronpack.kernels import load_kernels
from neuronpack.models.attention import Attention
from neuronpack.models.layers import Linear
from neuronpack.models.quant import Int8Linear


def use_kernels(module: nn.Module, library: Path | None = None) -> None:
    """Make every float ``Linear`` and int8 ``Int8Linear`` of ``module`` run neuronpack's kernels, and every
    ``Attention`` its decode attention (one token per row), in place (registered from ``library``, an artifact's
    copy, or this machine's build; see neuronpack/kernels)."""
    load_kernels(library)
    for mod in module.modules():
        if isinstance(mod, (Linear, Int8Linear, Attention)):
            mod.kernel = True
