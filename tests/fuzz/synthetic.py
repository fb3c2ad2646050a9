"""Tiny checkpoints written byte by byte from (dtype, shape) tables, so tests can make them wrong in any way: a Llama
decoder (``llama_shapes``) and EAGLE-1/2 / EAGLE-3 drafts with the public tensor names (``eagle_shapes``).

Example::

    model = write_checkpoint(tmp_path / "m", {n: ("F32", s) for n, s in llama_shapes().items()}, llama_config())
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np

H, V, FF = 8, 16, 12
NP_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "BOOL": np.bool_, "I8": np.int8,
             "I32": np.int32}
BF16 = "BF16"


def write_checkpoint(root: Path, tensors: dict[str, tuple[str, tuple[int, ...]]], config: dict, *,
                     fill: str = "random", seed: int = 0) -> Path:
    """A one-file safetensors checkpoint of ``{name: (dtype, shape)}``; data ``fill``: random | zeros | nan | inf."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(seed)
    header, chunks, offset = {}, [], 0
    for name, (dtype, shape) in tensors.items():
        if dtype == BF16:  # numpy has no bfloat16: the top half of float32 values
            data = (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
        else:
            arr = rng.standard_normal(shape) if fill == "random" else np.zeros(shape)
            if fill in ("nan", "inf") and arr.size and np.issubdtype(NP_DTYPES[dtype], np.floating):
                arr.flat[0] = np.nan if fill == "nan" else np.inf
            data = arr.astype(NP_DTYPES[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    (root / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(chunks))
    return root


def layer(prefix: str) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.self_attn.{p}.weight": (H, H) for p in ("q_proj", "k_proj", "v_proj", "o_proj")} | {
        f"{prefix}.mlp.gate_proj.weight": (FF, H), f"{prefix}.mlp.up_proj.weight": (FF, H),
        f"{prefix}.mlp.down_proj.weight": (H, FF), f"{prefix}.post_attention_layernorm.weight": (H,),
    }


def llama_shapes(layers: int = 2, tied: bool = False) -> dict[str, tuple[int, ...]]:
    shapes = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    for i in range(layers):
        shapes |= layer(f"model.layers.{i}") | {f"model.layers.{i}.input_layernorm.weight": (H,)}
    if not tied:
        shapes["lm_head.weight"] = (V, H)
    return shapes


def llama_config(tied: bool = False) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "vocab_size": V,
            "intermediate_size": FF, "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 2,
            "tie_word_embeddings": tied, "torch_dtype": "float32"}


def eagle_shapes(layout: str) -> dict[str, tuple[int, ...]]:
    if layout == "eagle1":
        return {"embed_tokens.weight": (V, H), "fc.weight": (H, 2 * H), "fc.bias": (H,)} | layer("layers.0")
    return ({"fc.weight": (H, 3 * H), "norm.weight": (H,), "lm_head.weight": (V, H), "d2t": (V,), "t2d": (V,),
             "midlayer.input_layernorm.weight": (H,), "midlayer.hidden_norm.weight": (H,)} | layer("midlayer"))


def eagle_dtypes(name: str, float_dtype: str) -> str:
    return {"d2t": "I64", "t2d": "BOOL"}.get(name, float_dtype)
