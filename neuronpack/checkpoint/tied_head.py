"""A checkpoint that ties its LM head to the input embedding in config.json (``tie_word_embeddings: true``) yet
stores an ``lm_head.weight`` of other values: its readers disagree about its head.

transformers 5.25 keeps the stored head ("both are present in the checkpoints with different values, so we will NOT
tie them"); vLLM skips ``lm_head.weight`` of a tied model and NxD Inference copies the embedding into the head, and
so did neuronpack's portable loader: an artifact that disagrees with transformers while nothing warned. transformers
itself writes such checkpoints (``save_pretrained`` of a tied model whose head was replaced). neuronpack follows no
reader silently: ``check_tied_head`` refuses the checkpoint with one line naming the tensor, the two readings and
how to pick one; compile runs it before a build (pipeline/compile.py) and eval on its reference
(accuracy/reference.py). A stored head equal to the embedding (some exports save both) is fine.

The two tensors are compared as stored: row chunks of bytes for safetensors (no torch), tensors for .bin.

Example::

    check_tied_head(open_checkpoint(Path("model")))     # CheckpointError when the stored head differs
"""

from __future__ import annotations

from neuronpack.checkpoint.reader import LM_HEAD, Checkpoint
from neuronpack.errors import CheckpointError

_CHUNK_BYTES = 16 * 2**20  # rows of both tensors compared per read


def check_tied_head(ckpt: Checkpoint) -> None:
    """CheckpointError when ``ckpt``'s config ties the head and its weights hold a different ``lm_head.weight``."""
    configs = [ckpt.config, ckpt.config.get("text_config") or {}]
    if not any(isinstance(c, dict) and c.get("tie_word_embeddings") is True for c in configs):
        return
    embedding = ckpt.embedding_name()
    if embedding is None or LM_HEAD not in ckpt.names() or _same_values(ckpt, LM_HEAD, embedding):
        return
    raise CheckpointError(
        f"config.json ties the LM head to the embeddings (tie_word_embeddings: true) but the weights store an "
        f"{LM_HEAD} that differs from {embedding}: transformers serves the stored head, vLLM and NxD Inference the "
        "embeddings", where=str(ckpt.root / "config.json"),
        fix=f'pick one: set "tie_word_embeddings": false in config.json to use the stored {LM_HEAD}, or remove '
            f"{LM_HEAD} from the weights to tie the head to {embedding}")


def _same_values(ckpt: Checkpoint, first: str, second: str) -> bool:
    a, b = ckpt.info(first), ckpt.info(second)
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    if ckpt.format != "safetensors":
        import torch

        return torch.equal(ckpt.get(first), ckpt.get(second))
    rows = a.shape[0] if a.shape else 0
    step = max(1, _CHUNK_BYTES // max(1, a.nbytes // max(rows, 1)))
    return all(ckpt.raw_rows(first, start, min(start + step, rows)) == ckpt.raw_rows(second, start,
                                                                                       min(start + step, rows))
               for start in range(0, rows, step))
