"""Names shared by the build and load sides of a portable artifact (torch-free).

Example::

    graph_name(CONTEXT, 128)                  # "context:128"  (manifest / neuron_config key)
    package_model_name("context:128")         # "context_128"  (model name inside graphs.pt2)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from neuronpack.buckets import BucketPlan

FORMAT = "neuronpack-torch"
FORMAT_VERSION = 1
GRAPHS_FILE = "graphs.pt2"
WEIGHTS_DIR = "weights"
NEURON_CONFIG = "neuron_config.json"
CONTEXT, TOKEN_GEN = "context", "token_generation"
# What a context graph returns (neuron_config.json "context_outputs"); artifacts built before prompt logits existed
# lack the key and return logits only.
CONTEXT_OUTPUTS = ("logits", "hidden")
# The graph wrappers hold the model as ``lm``: checkpoint tensor ``x`` is the graph constant ``lm.x``.
WEIGHT_PREFIX = "lm."


def graph_name(kind: str, length: int) -> str:
    """``context:128`` / ``token_generation:512``: a bucket's name in neuron_config.json and the manifest."""
    return f"{kind}:{length}"


def package_model_name(name: str) -> str:
    """Model names inside graphs.pt2 are path components: ``context:128`` -> ``context_128``."""
    return name.replace(":", "_")


def iter_graphs(plan: BucketPlan) -> Iterator[tuple[str, int]]:
    """(kind, length) for every bucket of the plan, context first."""
    for length in plan.context:
        yield CONTEXT, length
    for length in plan.token_generation:
        yield TOKEN_GEN, length
