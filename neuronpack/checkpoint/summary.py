"""What a checkpoint holds, read back from its headers and config (torch-free): architecture, parameter count,
dtype, layers, vocabulary, tied embeddings, files.

Example::

    summarize_checkpoint(Path("smollm2"))["parameters"]     # 134515008
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from neuronpack.checkpoint.reader import open_checkpoint


def summarize_checkpoint(path: Path) -> dict[str, Any]:
    ckpt = open_checkpoint(Path(path))
    config = ckpt.config
    return {
        "out": str(path),
        "architecture": (config.get("architectures") or [config.get("model_type")])[0],
        "model_type": config.get("model_type"),
        "parameters": sum(math.prod(shape) for _name, _dtype, shape in ckpt.weight_identity()),
        "dtype": config.get("dtype") or config.get("torch_dtype"),
        "layers": config.get("num_hidden_layers"),
        "vocab_size": config.get("vocab_size"),
        "tied": ckpt.tied,
        "files": sorted(p.name for p in Path(path).iterdir()),
    }
