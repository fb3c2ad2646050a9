"""The cost model that weighs the three kinds of padding against each other, in prompt-token equivalents.

- A context-encoding (prefill) graph of bucket b does the work of b prompt tokens whatever the prompt's length: every
  projection and MLP runs on b rows (NxDI traces one fixed-shape graph per bucket, models/model_wrapper.py; the
  plugin pads each prefill chunk to its bucket). One padded prompt token costs 2 x params FLOPs: the unit (1).
- A token-generation step in KV bucket b reads b cached positions per row (NxDI slices the cache to the bucket; the
  plugin's decode NEFF reads its bucket's blocks, "Decode Context-Length Bucketing" in the vLLM Neuron docs), and a
  decode step is bound by memory reads, not FLOPs. One padded KV position of one row costs its K and V bytes at the
  device's bandwidth: ``KV_WEIGHT = R * kv_bytes / (2 * params)`` prompt tokens, where R is the device's FLOPs per byte
  of HBM bandwidth: 230 on all three Neuron generations (Trainium1 and Inferentia2: 190 BF16 TFLOPS and 820 GB/s per
  chip; Trainium2: 667 TFLOPS and 2.9 TB/s; AWS's instance pages).
- A padded row of a decode batch bucket reads its row of KV like a real one: ``KV_WEIGHT x`` the sample's mean KV
  length per padded row-step.

The model's shape comes from its config.json; without one, Llama-3.1-8B's (the output says which).
"""

from __future__ import annotations

from dataclasses import dataclass

from neuronpack.errors import CheckpointError

FLOPS_PER_BYTE = 230
# Llama-3.1-8B's config.json: the shape used when the model's own is not given
REFERENCE_SHAPE = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}
REFERENCE_NAME = "Llama-3.1-8B (pass --model for your model's shape)"


@dataclass(frozen=True)
class CostModel:
    kv_weight: float  # one padded KV position of one decode row, in padded prompt tokens
    params: int
    kv_bytes_per_position: int
    shape_from: str

    def to_dict(self) -> dict:
        return {"kv_weight": self.kv_weight, "params": self.params,
                "kv_bytes_per_position": self.kv_bytes_per_position, "shape_from": self.shape_from,
                "flops_per_byte": FLOPS_PER_BYTE}


def cost_model(config: dict | None, dtype: str, shape_from: str) -> CostModel:
    """The weights for a model's config.json (``None``: the reference shape) stored as ``dtype``."""
    c = config or REFERENCE_SHAPE
    try:
        return _cost_model(c, dtype, shape_from if config else REFERENCE_NAME)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise CheckpointError("config.json lacks the decoder's shape (num_hidden_layers, hidden_size, "
                              "num_attention_heads, intermediate_size, vocab_size)", where=shape_from,
                              fix="pass --model with a decoder-only checkpoint's directory") from None


def _cost_model(c: dict, dtype: str, shape_from: str) -> CostModel:
    layers, hidden = int(c["num_hidden_layers"]), int(c["hidden_size"])
    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or hidden // heads)
    params = layers * (2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
                       + 3 * hidden * int(c["intermediate_size"])) + int(c["vocab_size"]) * hidden
    kv_bytes = 2 * layers * kv_heads * head_dim * {"float32": 4}.get(dtype, 2)
    return CostModel(FLOPS_PER_BYTE * kv_bytes / (2 * params), params, kv_bytes, shape_from)
