"""Checkpoint conversions: EAGLE drafts for NxDI (eagle.py) and int8/fp8 weight quantization (quantize.py).

Importing this package does not import torch, nor its submodules until a name is used (``neuronpack.lazy``).
"""

from neuronpack.lazy import lazy_attributes

_EXPORTS = {
    "EagleResult": "eagle",
    "convert_eagle": "eagle",
    "eagle_nxd_hints": "eagle",
    "QuantizeOptions": "quantize",
    "QuantizeResult": "quantize",
    "nxd_quantization_fields": "quantize",
    "quantize_checkpoint": "quantize",
    "quantized_checkpoint_path": "quantize",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_attributes(__name__, _EXPORTS)
