"""Names shared by the build and load sides of a portable artifact (torch-free).

An artifact holds a decoder-layer graph (two: any step, and decode) and a head graph, compiled with dynamic shapes
(see graphs.py) for prefill, decode and verification, and with an EAGLE draft two draft graphs (draft_graphs.py);
the bucket plan bounds them (largest context bucket = longest prompt, seq_len = longest sequence) instead of
multiplying graphs.

Example::

    LAYER_STEP, LAYER_DECODE, HEAD            # graph names in neuron_config.json "graphs" and in graphs.pt2
"""

from __future__ import annotations

from neuronpack.kernels import LIBRARY_NAME

FORMAT = "neuronpack-torch"
# 1: one static graph per bucket; 2: one dynamic graph per kind, decode over active rows only; 3: functional
# per-layer graphs (weights as inputs, the new K/V returned, not written) + a head graph, for every kind of step;
# 4: with ``packed_linears`` the graphs took the float linears' weights oneDNN-packed; 5: plain weights again, and
# with ``linear_kernels`` the graphs' linears call neuronpack's decode kernels (torch.ops.neuronpack.*); 6: the decode
# layer graph computes attention as fused loops (no bmm calls), and int8 one-row linears use vpdpwssd; 7: with
# ``linear_kernels`` the decode layer graph calls torch.ops.neuronpack.decode_attention; 8: the shipped kernels' int8
# one-row linears read rows in order through vpdpbusd (kernels/int8_row.cpp); 9: the shipped decode attention
# prefetches the cache rows it reads (kernels/attention.cpp); 10: the shipped kernels' int8 linears over 2-16 rows
# round each row of x to int16 and dot it through vpdpwssd (kernels/int8_rows.cpp)
FORMAT_VERSION = 10
GRAPHS_FILE = "graphs.pt2"
WEIGHTS_DIR = "weights"
DRAFT_DIR = "draft"  # the converted EAGLE draft ([speculation] kind = "eagle")
NEURON_CONFIG = "neuron_config.json"
KERNELS_LIBRARY = LIBRARY_NAME  # with linear_kernels: the artifact's copy of the kernels its graphs call
LAYER_STEP, LAYER_DECODE, HEAD = "layer_step", "layer_decode", "head"
DRAFT_STEP, DRAFT_HEAD = "draft_step", "draft_head"  # an EAGLE artifact's draft graphs (draft_graphs.py)
DRAFT_GRAPHS = (DRAFT_STEP, DRAFT_HEAD)


def cache_positions(seq_len: int) -> int:
    """Positions per KV-cache row: one spare beyond ``seq_len``. An attention length equal to the whole row would
    make the slice ``cache[:, :, :L]`` contiguous for that one value, and export refuses the guard that tells it
    apart; with a spare position no attention length (<= seq_len) covers the row."""
    return seq_len + 1
