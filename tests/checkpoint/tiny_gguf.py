"""Write a tiny llama GGUF from a tiny HF checkpoint, the way llama.cpp's convert_hf_to_gguf.py does (tensor names,
the rotary Q/K row permutation, byte-level BPE tokenizer metadata), so import_gguf can be checked against the HF
original without a download.

Example::

    write_tiny_gguf(make_checkpoint("smollm"), tmp_path / "tiny.gguf", tensor_type="Q8_0")
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf_name: str) -> str:
    if hf_name in GGUF_NAMES:
        return GGUF_NAMES[hf_name]
    _model, _layers, index, rest = hf_name.split(".", 3)
    return f"blk.{index}.{LAYER_NAMES[rest]}"


def permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp stores Q/K rows interleaved per rotary pair (convert_hf_to_gguf.LlamaModel.permute)."""
    return weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape
    )


def write_tiny_gguf(checkpoint: Path, out: Path, *, tensor_type: str = "F32") -> Path:
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((checkpoint / "config.json").read_text())
    tensors = load_file(checkpoint / "model.safetensors")
    writer = gguf.GGUFWriter(str(out), "llama")
    _write_config(writer, config)
    _write_tokenizer(writer, checkpoint, config)
    qtype = gguf.GGMLQuantizationType[tensor_type]
    for name, data in sorted(tensors.items()):
        data = data.astype(np.float32)
        if name.endswith("q_proj.weight"):
            data = permute(data, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            data = permute(data, config["num_key_value_heads"])
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        # Like llama.cpp: norms, and rows that do not fill whole quantization blocks, stay F32.
        if data.ndim == 1 or tensor_type == "F32" or data.shape[-1] % block:
            writer.add_tensor(gguf_name(name), data)
        else:
            writer.add_tensor(gguf_name(name), gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _write_config(writer, config: dict) -> None:
    writer.add_name("tiny-llama")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    rope = config.get("rope_parameters") or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_rope_dimension_count(config["hidden_size"] // config["num_attention_heads"])


def _write_tokenizer(writer, checkpoint: Path, config: dict) -> None:
    tok = json.loads((checkpoint / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = [None] * len(vocab)
    for token, index in vocab.items():
        tokens[index] = token
    special = {added["content"] for added in tok["added_tokens"] if added.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    template = json.loads((checkpoint / "tokenizer_config.json").read_text()).get("chat_template")
    if template is None and (checkpoint / "chat_template.jinja").exists():
        template = (checkpoint / "chat_template.jinja").read_text()
    if template:
        writer.add_chat_template(template)
