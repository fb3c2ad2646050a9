"""The portable Llama-family model (llama, llama3, mistral, qwen2, SmolLM) used by the torch backend and runtime.

Importing this package is torch-free; ``neuronpack.models.llama`` and ``load_model`` import torch.

Example::

    from neuronpack.models import ModelConfig, load_model
    model = load_model(Path("SmolLM2-135M"), torch.float32)
"""

from neuronpack.models.config import SUPPORTED_MODEL_TYPES, ModelConfig
from neuronpack.models.loading import load_model, model_tensors, quantized_linears, resolve_dtype

__all__ = ["SUPPORTED_MODEL_TYPES", "ModelConfig", "load_model", "model_tensors", "quantized_linears",
           "resolve_dtype"]
