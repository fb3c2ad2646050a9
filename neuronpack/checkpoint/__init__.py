"""Read and write Hugging Face checkpoints: safetensors (single/sharded) and safe .bin reading, a streaming sharded
safetensors writer, hub/local model resolution, and GGUF import.

Importing this package does not import torch: safetensors headers are read as JSON, so cache-hit checks stay fast.

Example::

    from neuronpack.checkpoint import open_checkpoint, write_safetensors_sharded, TensorSpec

    ckpt = open_checkpoint(resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct"))
    specs = [TensorSpec(n, ckpt.get(n).dtype, ckpt.info(n).shape) for n in ckpt.names()]
    write_safetensors_sharded(staging, specs, ckpt.iter_tensors())
"""

from neuronpack.checkpoint.aux_files import AUX_FILES, copy_aux_files
from neuronpack.checkpoint.dtypes import safetensors_dtype
from neuronpack.checkpoint.gguf_import import find_packaged_gguf, import_gguf
from neuronpack.checkpoint.hub import resolve_model
from neuronpack.checkpoint.reader import Checkpoint, open_checkpoint
from neuronpack.checkpoint.safetensors_header import TensorInfo, read_safetensors_header
from neuronpack.checkpoint.summary import summarize_checkpoint
from neuronpack.checkpoint.writer import TensorSpec, write_safetensors_sharded

__all__ = [
    "AUX_FILES",
    "Checkpoint",
    "TensorInfo",
    "TensorSpec",
    "copy_aux_files",
    "find_packaged_gguf",
    "import_gguf",
    "open_checkpoint",
    "read_safetensors_header",
    "resolve_model",
    "safetensors_dtype",
    "summarize_checkpoint",
    "write_safetensors_sharded",
]
