"""Checkpoint conversions: EAGLE drafts for NxDI (eagle.py) and int8/fp8 weight quantization (quantize.py).

Importing this package does not import torch.
"""

from neuronpack.convert.eagle import EagleResult as EagleResult
from neuronpack.convert.eagle import convert_eagle as convert_eagle
from neuronpack.convert.eagle import eagle_nxd_hints as eagle_nxd_hints
from neuronpack.convert.quantize import QuantizeOptions as QuantizeOptions
from neuronpack.convert.quantize import QuantizeResult as QuantizeResult
from neuronpack.convert.quantize import nxd_quantization_fields as nxd_quantization_fields
from neuronpack.convert.quantize import quantize_checkpoint as quantize_checkpoint
from neuronpack.convert.quantize import quantized_checkpoint_path as quantized_checkpoint_path
