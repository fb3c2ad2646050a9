"""The portable models used by the torch backend and runtime: one decoder (decoder.py) over shared layers
(layers.py, attention.py, rope.py), one module per family (families/), one registry from a checkpoint's model_type to
its family (registry.py).

Importing this package is torch-free; ``neuronpack.models.decoder`` and ``load_model`` import torch.

Example::

    from neuronpack.models import ModelConfig, load_model
    model = load_model(Path("SmolLM2-135M"), torch.float32)
"""

from neuronpack.models.config import ModelConfig
from neuronpack.models.loading import load_model, model_tensors, quantized_linears, resolve_dtype
from neuronpack.models.registry import SUPPORTED_MODEL_TYPES

__all__ = ["SUPPORTED_MODEL_TYPES", "ModelConfig", "load_model", "model_tensors", "quantized_linears",
           "resolve_dtype"]
