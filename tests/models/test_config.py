"""ModelConfig parsing: supported families, rope spellings, and clear refusals."""

from __future__ import annotations

import pytest

from neuronpack.errors import UnsupportedModelError
from neuronpack.models.config import ModelConfig

BASE = {
    "model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
}


def test_llama_defaults():
    cfg = ModelConfig.from_hf(BASE)
    assert (cfg.head_dim, cfg.queries_per_kv, cfg.qkv_bias, cfg.o_bias) == (16, 2, False, False)
    assert cfg.rope == {"rope_type": "default", "rope_theta": 10000.0}


def test_qwen2_has_qkv_bias_only():
    cfg = ModelConfig.from_hf({**BASE, "model_type": "qwen2", "use_sliding_window": False, "sliding_window": 64})
    assert cfg.qkv_bias and not cfg.o_bias and cfg.sliding_window is None


def test_llama_attention_bias_covers_o_proj():
    cfg = ModelConfig.from_hf({**BASE, "attention_bias": True})
    assert cfg.qkv_bias and cfg.o_bias


@pytest.mark.parametrize("spelling", ["rope_parameters", "rope_scaling"])
def test_llama3_rope_both_spellings(spelling):
    rope = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    if spelling == "rope_parameters":
        hf = {**BASE, "rope_parameters": {**rope, "rope_type": "llama3", "rope_theta": 500000.0}}
    else:  # transformers 4.x: theta at top level, "type" or "rope_type" in rope_scaling
        hf = {**BASE, "rope_theta": 500000.0, "rope_scaling": {**rope, "type": "llama3"}}
    cfg = ModelConfig.from_hf(hf)
    assert cfg.rope["rope_type"] == "llama3" and cfg.rope["rope_theta"] == 500000.0 and cfg.rope["factor"] == 8.0


def test_unsupported_model_type_names_the_field():
    with pytest.raises(UnsupportedModelError) as info:
        ModelConfig.from_hf({**BASE, "model_type": "gpt2"})
    assert "gpt2" in info.value.what and info.value.where == "config.json model_type"


def test_unsupported_rope_type():
    with pytest.raises(UnsupportedModelError, match="yarn"):
        ModelConfig.from_hf({**BASE, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}})


def test_sliding_window_refused_unless_never_reached():
    hf = {**BASE, "model_type": "mistral", "sliding_window": 128}
    with pytest.raises(UnsupportedModelError) as info:
        ModelConfig.from_hf(hf, max_seq_len=256)
    assert "128" in info.value.fix
    assert ModelConfig.from_hf(hf, max_seq_len=128).sliding_window is None
    # A window as long as the context is no window at all.
    assert ModelConfig.from_hf({**hf, "sliding_window": 512}).sliding_window is None
