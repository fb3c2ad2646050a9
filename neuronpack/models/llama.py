"""The names code written before models/ had families imports from here (tests, the runtime's EAGLE proposer): the
Llama-family decoder is now any family's ``CausalLM`` (decoder.py) built from the shared layers (layers.py,
attention.py, rope.py) by families/llama.py. New code imports from those modules.

Example::

    from neuronpack.models.llama import store_kv      # the same function as neuronpack.models.attention.store_kv
"""

from __future__ import annotations

from neuronpack.models.attention import Attention, StepMasks, causal_mask, store_kv
from neuronpack.models.layers import Linear
from neuronpack.models.rope import rope_cos_sin

__all__ = ["Attention", "Linear", "StepMasks", "causal_mask", "rope_cos_sin", "store_kv"]
