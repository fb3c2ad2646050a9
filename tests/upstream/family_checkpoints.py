"""Tiny random checkpoints of the 2026 model families in their released layouts, written by transformers itself.

- ``qwen3`` (tied or untied), ``qwen3_moe``: transformers' save_pretrained (per-expert ``mlp.experts.N.*`` weights).
- every config.json in the released (transformers 4.x) names: see ``released_config``.
- ``llama4``: Meta's multimodal layout (``Llama4ForConditionalGeneration``: ``language_model.model.*``, a vision
  tower, ``text_config`` / ``vision_config``), 4 layers: MoE every second layer, chunked attention (chunk 8), a NoPE
  layer, q/k norms, so every path of the text decoder runs.
- ``gpt_oss``: the released MXFP4 layout, which transformers does not write (it saves dequantized experts): a random
  GptOssForCausalLM is saved by transformers, then its expert matrices are packed as the released checkpoints hold
  them (``mlp.experts.{gate_up,down}_proj_{blocks,scales}``: uint8 FP4 pairs, low nibble first, per 32 values one
  E8M0 exponent; transformers' [E, in, out] transposed to [E, out, in]), with the released config keys
  (``initial_context_length``, ``experts_per_token``, ``quantization_config``). transformers' own MXFP4 loader
  dequantizes it back to exactly the packed values (the random weights are drawn on the FP4 grid).
- Gemma 3: the judge's own writer, neuronpack/backends/nxd/defects.py ``write_tiny_gemma3``.

Norms are randomised too, so a norm NxDI failed to load would show. Example::

    path = write_family_checkpoint(tmp_path / "moe", "qwen3_moe")
"""

from __future__ import annotations

import json
from pathlib import Path

FAMILIES = ("qwen3", "qwen3_tied", "qwen3_moe", "gpt_oss", "llama4")
# the shipped recipes' checkpoints (their model.source) -> the tiny family that stands for them; others: a tiny Llama
RECIPE_FAMILY = {"Qwen/Qwen3-8B": "qwen3", "Qwen/Qwen3-30B-A3B": "qwen3_moe", "openai/gpt-oss-20b": "gpt_oss",
                 "meta-llama/Llama-4-Scout-17B-16E-Instruct": "llama4"}
FP4 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
MXFP4_CONFIG = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}


def write_family_checkpoint(out: Path, family: str, *, seed: int = 0, released: bool = True) -> Path:
    """A tiny random checkpoint of ``family`` (FAMILIES) with the tiny test tokenizer, in ``out``; ``released=False``
    keeps config.json as the transformers at hand wrote it (transformers 5: ``rope_parameters``)."""
    import transformers

    from tests.helpers.tiny_models import make_tokenizer

    tokenizer = make_tokenizer()
    config = _config(transformers, family, len(tokenizer))
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(config.get_text_config() if hasattr(config, "get_text_config") else config, key,
                getattr(tokenizer, key))
    model = _randomised(_model_class(transformers, family)(config), seed)
    out = Path(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if released:
        released_config(out)
    if family == "gpt_oss":
        pack_experts_mxfp4(out)
    return out


def recipe_family(recipe: Path) -> str | None:
    """The family of a recipe file's checkpoint (RECIPE_FAMILY), None for a Llama-family one."""
    import tomllib

    return RECIPE_FAMILY.get(tomllib.loads(Path(recipe).read_text()).get("model", {}).get("source", ""))


def released_config(checkpoint: Path) -> None:
    """config.json as the released checkpoints (and transformers 4.x) write it, whichever transformers saved it:
    transformers 5 keeps rope_theta / rope_scaling inside ``rope_parameters`` and names Qwen3-MoE's expert count
    ``num_local_experts``; NxDI reads config.json with transformers 4.57, which knows only the released names."""
    config = json.loads((checkpoint / "config.json").read_text())
    for section in (config, config.get("text_config"), config.get("vision_config")):
        if isinstance(section, dict) and isinstance(section.get("rope_parameters"), dict):
            rope = dict(section.pop("rope_parameters"))
            section["rope_theta"] = rope.pop("rope_theta")
            section["rope_scaling"] = None if rope == {"rope_type": "default"} else rope
    if config.get("model_type") == "qwen3_moe" and "num_local_experts" in config:
        config["num_experts"] = config.pop("num_local_experts")
    (checkpoint / "config.json").write_text(json.dumps(config, indent=2))


def pack_experts_mxfp4(checkpoint: Path) -> None:
    """Rewrite a transformers-saved GptOss checkpoint in place in the released MXFP4 layout (see the module)."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(checkpoint / "model.safetensors")
    for name in [n for n in tensors if n.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))]:
        blocks, scales = _mxfp4(tensors.pop(name).transpose(1, 2))
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
    tensors = {n: t.to(torch.bfloat16) if t.is_floating_point() else t for n, t in tensors.items()}
    save_file(tensors, checkpoint / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((checkpoint / "config.json").read_text())
    config.update(initial_context_length=4096, experts_per_token=config["num_experts_per_tok"],
                  quantization_config=MXFP4_CONFIG, torch_dtype="bfloat16")
    config.pop("dtype", None)
    (checkpoint / "config.json").write_text(json.dumps(config, indent=2))


def _mxfp4(weight):
    """[E, rows, cols] floats on the FP4 grid x 2^e -> (blocks uint8 [E, rows, cols / 32, 16], scales uint8
    [E, rows, cols / 32]): per 32 values the exponent that puts their largest magnitude at or below 6."""
    import torch

    grid = torch.tensor(FP4)
    experts, rows, cols = weight.shape
    groups = weight.float().reshape(experts, rows, cols // 32, 32)
    exponent = torch.ceil(torch.log2(groups.abs().amax(-1).clamp_min(2.0**-100) / 6.0)).clamp(-127, 127)
    scaled = groups / torch.exp2(exponent)[..., None]
    codes = (scaled[..., None] - grid).abs().argmin(-1)  # nearest FP4 code: exact for values on the grid
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return blocks.contiguous(), (exponent + 127).to(torch.uint8).contiguous()


def _randomised(model, seed: int):
    """Weights drawn N(0, 0.15), 1-D ones around their neutral value (1 for norms, 0 for biases and sinks); gpt-oss
    experts on the FP4 grid times a power of two (exact in MXFP4)."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")) and "GptOss" in type(model).__name__:
                codes = torch.randint(0, 16, param.shape)
                param.copy_(torch.tensor(FP4)[codes] * 2.0**-4)
            elif param.dim() >= 2:
                param.normal_(0.0, 0.15)
            elif "norm" in name:
                param.normal_(1.0, 0.1)
            else:
                param.normal_(0.0, 0.1)
    return model.eval()


def _model_class(transformers, family: str):
    return {"qwen3": transformers.Qwen3ForCausalLM, "qwen3_tied": transformers.Qwen3ForCausalLM,
            "qwen3_moe": transformers.Qwen3MoeForCausalLM, "gpt_oss": transformers.GptOssForCausalLM,
            "llama4": transformers.Llama4ForConditionalGeneration}[family]


def _config(transformers, family: str, vocab: int):
    common = dict(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-5)
    if family in ("qwen3", "qwen3_tied"):
        return transformers.Qwen3Config(**common, intermediate_size=128, rope_theta=1e6,
                                        tie_word_embeddings=family == "qwen3_tied")
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**common, intermediate_size=128, moe_intermediate_size=32, num_experts=4,
                                           num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                                           mlp_only_layers=[], tie_word_embeddings=False)
    if family == "gpt_oss":
        rope = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}
        return transformers.GptOssConfig(**common, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
                                         sliding_window=8, rope_scaling=rope, tie_word_embeddings=False)
    if family == "llama4":
        text = dict(common, num_hidden_layers=4, intermediate_size=32, intermediate_size_mlp=128, num_local_experts=4,
                    num_experts_per_tok=1, interleave_moe_layer_step=2, attention_chunk_size=8, rope_theta=5e5,
                    use_qk_norm=True)
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      image_size=28, patch_size=14, vision_output_dim=32, projector_input_dim=32,
                      projector_output_dim=64, pixel_shuffle_ratio=0.5)
        return transformers.Llama4Config(text_config=text, vision_config=vision)
    raise ValueError(f"unknown family {family!r}: one of {FAMILIES}")
