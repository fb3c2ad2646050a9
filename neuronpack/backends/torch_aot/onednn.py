"""AOTInductor lowering of oneDNN's packed linear when the packed weight is a graph input (models/packing.py).

Inductor lowers ``torch.ops.mkldnn._linear_pointwise`` only for weights its own freezing pass packed into graph
constants (the lowering asserts it, for autotuning). Our graphs take every layer's packed weights as inputs (one
compiled layer serves all layers), so while compiling, ``packed_linear_lowering`` puts in a lowering that emits the
same extern kernel (``mkldnn_ir.LinearUnary``: a direct ``aoti_torch_cpu__linear_pointwise`` call in the C++ wrapper)
without that assertion and without autotuning. The packed weight is passed through untouched: its layout is opaque
(its fake strides mean nothing), so it must never be made contiguous or copied.

Example::

    with packed_linear_lowering():
        files = torch._inductor.aot_compile(module, args, options=INDUCTOR_SETTINGS)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def packed_linear_lowering() -> Iterator[None]:
    """Within the block, inductor lowers ``mkldnn._linear_pointwise`` (and its ``.binary`` form, a linear plus an
    added tensor, which inductor's fusion passes make of ``linear(x) + residual``) on packed graph inputs."""
    import torch
    from torch._inductor import lowering

    if not torch._C._has_mkldnn:  # nothing to lower: graphs are never packed without oneDNN
        yield
        return
    ops = {torch.ops.mkldnn._linear_pointwise.default: _lower_linear,
           torch.ops.mkldnn._linear_pointwise.binary: _lower_linear_binary}
    previous = {op: lowering.lowerings.get(op) for op in ops}
    lowering.lowerings.update(ops)
    try:
        yield
    finally:
        for op, lower in previous.items():
            if lower is None:
                lowering.lowerings.pop(op, None)
            else:
                lowering.lowerings[op] = lower


def _lower_linear(x, w, b, attr, scalars, algorithm, layout=None):
    """x [..., in] (any leading dims), packed w [out, in], bias [out] or None -> [..., out]."""
    from torch._inductor.mkldnn_ir import LinearUnary

    return _extern_linear(LinearUnary, x, [], w, b, [attr, scalars or [-1], algorithm])


def _lower_linear_binary(x, y, w, b, attr, layout=None):
    """linear(x) combined (``attr``: "add" or "sum") with y [..., out]."""
    from torch._inductor.mkldnn_ir import LinearBinary

    return _extern_linear(LinearBinary, x, [y], w, b, [attr])


def _extern_linear(kind, x, others: list, w, b, args: list):
    """The ``kind`` extern kernel (mkldnn_ir.LinearUnary / LinearBinary) over 2-D rows: inputs x, *others, w (as
    given: never made contiguous), bias; ``args`` its constant arguments (a leading None when there is no bias)."""
    from torch._inductor.ir import ExternKernel, FixedLayout, TensorBox
    from torch._inductor.lowering import view
    from torch._inductor.mkldnn_ir import _create_output_node

    def rows(t):  # [..., n] -> [rows, n], contiguous
        size = t.get_size()
        return ExternKernel.require_contiguous(ExternKernel.realize_input(view(t, [-1, size[-1]]) if len(size) > 2
                                                                          else t))

    lead = x.get_size()[:-1]
    x = rows(x)
    inputs = [x, *(rows(o) for o in others), ExternKernel.realize_input(w)]
    if b is None:
        args = [None, *args]
    else:
        inputs.append(ExternKernel.require_contiguous(ExternKernel.realize_input(b)))
    out_features = w.get_size()[0]
    node = kind(layout=FixedLayout(x.get_device(), x.get_dtype(), [x.get_size()[0], out_features]), inputs=inputs,
                constant_args=args)
    result = TensorBox.create(_create_output_node(node))
    return view(result, [*lead, out_features]) if len(lead) > 1 else result
