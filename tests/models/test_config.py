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


def test_sliding_window_layers_unless_never_reached():
    hf = {**BASE, "model_type": "mistral", "sliding_window": 128}
    cfg = ModelConfig.from_hf(hf, max_seq_len=256)  # Mistral: every layer a sliding window
    assert cfg.sliding_window == 128 and cfg.layer_types == ("sliding_attention",) * 2
    assert cfg.window(cfg.layer_kind(1)) == 128
    assert ModelConfig.from_hf(hf, max_seq_len=128).sliding_window is None  # never reached: full attention
    # A window as long as the context is no window at all.
    assert ModelConfig.from_hf({**hf, "sliding_window": 512}).sliding_window is None
    qwen = {**BASE, "model_type": "qwen2", "sliding_window": 64, "use_sliding_window": True, "max_window_layers": 1}
    cfg = ModelConfig.from_hf(qwen)  # Qwen: the layers from max_window_layers on (or config.json's layer_types)
    assert cfg.layer_types == ("full_attention", "sliding_attention") and cfg.sliding_window == 64
    declared = ModelConfig.from_hf({**qwen, "layer_types": ["sliding_attention", "full_attention"]})
    assert declared.layer_types == ("sliding_attention", "full_attention")
    with pytest.raises(UnsupportedModelError, match="layer_types"):
        ModelConfig.from_hf({**qwen, "layer_types": ["sliding_attention"]})


def test_gemma3_reads_both_spellings_and_a_multimodal_text_config():
    text = {**BASE, "model_type": "gemma3_text", "head_dim": 16, "num_hidden_layers": 6, "sliding_window": 32,
            "query_pre_attn_scalar": 24, "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}
    cfg = ModelConfig.from_hf(text)
    assert cfg.family == "gemma3" and cfg.tie_word_embeddings  # Gemma ties unless told otherwise
    assert cfg.layer_types == ("sliding_attention",) * 5 + ("full_attention",)  # every 6th layer global
    assert cfg.rope == {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0}
    assert cfg.rope_for("sliding_attention") == {"rope_type": "default", "rope_theta": 10000.0}
    assert cfg.scale == 24 ** -0.5 and cfg.hidden_act == "gelu_pytorch_tanh" and cfg.attn_softcap is None
    old = {key: value for key, value in text.items() if key != "rope_parameters"}  # transformers 4.x spelling
    old |= {"rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": {"type": "linear", "factor": 8.0}}
    assert ModelConfig.from_hf(old) == cfg
    multimodal = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": text,
                  "vision_config": {"model_type": "siglip_vision_model"}}
    assert ModelConfig.from_hf(multimodal) == cfg
    with pytest.raises(UnsupportedModelError, match="bidirectional"):
        ModelConfig.from_hf({**text, "use_bidirectional_attention": True})
