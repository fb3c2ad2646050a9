"""Read and write Hugging Face checkpoints: safetensors (single/sharded) and safe .bin reading, a streaming sharded
safetensors writer, hub/local model resolution, and GGUF import.

Importing this package does not import torch: safetensors headers are read as JSON, so cache-hit checks stay fast.
The names below are imported from their submodules on first use (``neuronpack.lazy``): a cache hit that only opens
a checkpoint never loads the writer or the GGUF importer.

Example::

    from neuronpack.checkpoint import open_checkpoint, write_safetensors_sharded, TensorSpec

    ckpt = open_checkpoint(resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct"))
    specs = [TensorSpec(n, ckpt.get(n).dtype, ckpt.info(n).shape) for n in ckpt.names()]
    write_safetensors_sharded(staging, specs, ckpt.iter_tensors())
"""

from neuronpack.lazy import lazy_attributes

_EXPORTS = {
    "AUX_FILES": "aux_files",
    "copy_aux_files": "aux_files",
    "safetensors_dtype": "dtypes",
    "find_packaged_gguf": "gguf_import",
    "import_gguf": "gguf_import",
    "resolve_model": "hub",
    "Checkpoint": "reader",
    "open_checkpoint": "reader",
    "TensorInfo": "safetensors_header",
    "read_safetensors_header": "safetensors_header",
    "summarize_checkpoint": "summary",
    "TensorSpec": "writer",
    "write_safetensors_sharded": "writer",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_attributes(__name__, _EXPORTS)
