"""oneDNN-prepacked weights for the float linears: the decode kernel that costs what it reads at small batch.

torch's plain ``F.linear`` (MKL) is a fast GEMV at one row but slow for 2-8 rows, and inductor's compiled matmul is
slower still; oneDNN's matmul over a weight reordered once into its blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``) serves 1..8 rows at about the cost of one (SmolLM2-135M's 210 layer
linears, 1 thread, Zen 4, CPU ms at 1/4/8 rows: float32 34/26/35 against F.linear's 34/44/53 and compiled F.linear's
41/56/64; bfloat16 18/17/20 against 28/31/35 and 38/41/46; bench/linears.py, docs/bench/linears.json).

A packed weight is an opaque ``torch._mkldnn`` tensor: it has no strides and cannot be saved, so artifacts store plain
weights and ``pack_linears`` packs a loaded model in place; ``Linear.forward`` (models/llama.py) runs the packed
kernel when its ``packed`` flag is set. Int8 linears keep their own kernel (models/quant.py).

Example::

    if can_pack(torch.float32):
        pack_linears(model)          # every float Linear's weight -> its packed copy (the plain one is freed)
    y = model.lm_head(x)             # the packed kernel
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from neuronpack.models.llama import Linear

# Rows the packed layout is chosen for. One layout serves every row count; packed for 8, float32 runs 1..8 rows
# (and a 64-256 row prefill) faster than a layout packed for 1 row, which is ~1.5x slower from 4 rows up.
PACK_ROWS_HINT = 8


def can_pack(dtype: torch.dtype) -> bool:
    """Whether this torch has oneDNN kernels for packed ``dtype`` weights (float32; bfloat16 where oneDNN runs it)."""
    if not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pack_weight(weight: Tensor) -> Tensor:
    """A float ``[out, in]`` weight in oneDNN's blocked layout (an opaque ``torch._mkldnn`` tensor, same shape)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_ROWS_HINT)


def linear_weight_names(module: nn.Module) -> set[str]:
    """Names (relative to ``module``) of the weights of its float ``Linear`` layers: what ``pack_linears`` packs."""
    return {f"{name}.weight" if name else "weight" for name, mod in module.named_modules() if isinstance(mod, Linear)}


def packed_weights(module: nn.Module, weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """``weights`` (names relative to ``module``) with its float linears' weights packed, in the same order; marks
    ``module``'s linears packed, so that it runs with them (e.g. a meta-device structure traced with these inputs)."""
    for mod in module.modules():
        if isinstance(mod, Linear):
            mod.packed = True
    names = linear_weight_names(module)
    return {name: pack_weight(t) if name in names and not t.is_mkldnn else t for name, t in weights.items()}


def pack_linears(module: nn.Module) -> None:
    """Pack the weight of every float ``Linear`` in ``module``, in place (a tied ``lm_head`` gets its own packed copy;
    the embedding keeps the plain tensor). The plain weights are dropped, and the pages they were read from (a
    memory-mapped checkpoint stays mapped while any of its tensors lives) are handed back to the kernel."""
    plain = []
    with torch.no_grad():
        for mod in module.modules():
            if isinstance(mod, Linear) and not mod.packed:
                plain.append(mod.weight.detach())
                mod.weight = nn.Parameter(pack_weight(mod.weight), requires_grad=False)
                mod.packed = True
    kept = {t.untyped_storage().data_ptr() for t in module.state_dict().values() if not t.is_mkldnn}
    for weight in plain:
        if weight.untyped_storage().data_ptr() not in kept:  # not the tied embedding, which stays in use
            _page_out(weight)


def _page_out(t: Tensor) -> None:
    """Best effort: ask the kernel to reclaim the whole pages under ``t`` (Linux ``MADV_PAGEOUT``: contents are kept,
    clean file-backed pages are simply dropped and read again if ever touched). No-op where unsupported."""
    import ctypes
    import mmap
    import sys

    if not sys.platform.startswith("linux"):
        return
    page = mmap.PAGESIZE
    start = -(-t.data_ptr() // page) * page
    end = (t.data_ptr() + t.numel() * t.element_size()) // page * page
    if end > start:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), 21)  # MADV_PAGEOUT (Linux 5.4+)
