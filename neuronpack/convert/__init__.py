"""Checkpoint conversions: EAGLE drafts for NxDI (eagle.py) and int8/fp8 weight quantization (quantize.py).

Importing this package does not import torch.
"""

from neuronpack.convert.eagle import EagleResult as EagleResult
from neuronpack.convert.eagle import convert_eagle as convert_eagle
from neuronpack.convert.eagle import eagle_nxd_hints as eagle_nxd_hints
