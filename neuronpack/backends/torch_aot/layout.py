"""Names shared by the build and load sides of a portable artifact (torch-free).

An artifact holds one step graph compiled with dynamic shapes (see graphs.py) for prefill, decode and verification;
the bucket plan bounds it (largest context bucket = longest prompt, seq_len = longest sequence) instead of
multiplying graphs.

Example::

    GRAPH_KINDS                               # ("step",): the names in neuron_config and graphs.pt2
"""

from __future__ import annotations

FORMAT = "neuronpack-torch"
# 1: one static graph per bucket; 2: one dynamic graph per kind, decode over active rows only; 3: one functional
# step graph (it returns the new K/V instead of writing the cache) for prefill, decode and verification
FORMAT_VERSION = 3
GRAPHS_FILE = "graphs.pt2"
WEIGHTS_DIR = "weights"
DRAFT_DIR = "draft"  # the converted EAGLE draft ([speculation] kind = "eagle")
NEURON_CONFIG = "neuron_config.json"
STEP = "step"
GRAPH_KINDS = (STEP,)
# The graph wrappers hold the model as ``lm``: checkpoint tensor ``x`` is the graph constant ``lm.x``.
WEIGHT_PREFIX = "lm."


def cache_positions(seq_len: int) -> int:
    """Positions per KV-cache row: one spare beyond ``seq_len``. An attention length equal to the whole row would
    make the slice ``cache[:, :, :L]`` contiguous for that one value, and export refuses the guard that tells it
    apart; with a spare position no attention length (<= seq_len) covers the row."""
    return seq_len + 1
