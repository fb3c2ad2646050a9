"""What the new families add, eager, against transformers on checkpoints it wrote: a sliding window reached (Mistral),
soft-capping when a config sets it (and the decode attention kernel, which has no cap, left out for it),
and a ``Gemma3ForConditionalGeneration`` checkpoint's text decoder read under its own names, its vision tower left
out by name. (Every tiny family's logits, Qwen3 and Gemma 3 included: test_llama.py.)"""

from __future__ import annotations

import pytest
import torch
import transformers

from neuronpack.models import load_model
from neuronpack.models.linear_kernels import use_kernels
from neuronpack.progress import NullReporter

TOKENS = torch.randint(3, 384, (2, 30), generator=torch.Generator().manual_seed(5))


def hf_logits(path, model_class=transformers.AutoModelForCausalLM):
    ref = model_class.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        return ref(TOKENS).logits.float()


def test_mistral_window_matches_transformers(make_checkpoint):
    path = make_checkpoint("mistral", overrides={"sliding_window": 8})
    model = load_model(path, torch.float32)
    assert model.config.sliding_window == 8 and set(model.config.layer_types) == {"sliding_attention"}
    with torch.no_grad():
        torch.testing.assert_close(model.forward_full(TOKENS), hf_logits(path), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_soft_capping_matches_transformers_without_the_attention_kernel(make_checkpoint, arch):
    """Gemma 2 caps its scores and logits, Gemma 3 only its logits (transformers and vLLM leave its attention cap
    unused): both equal transformers'; a decode step with the kernels on (the linears' kernels; a capped attention
    in torch ops, the kernel has no cap) gives the logits of the cache-free forward."""
    path = make_checkpoint(arch, overrides={"attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0})
    model = load_model(path, torch.float32)
    assert (model.config.attn_softcap, model.config.final_softcap) == (2.0 if arch == "gemma2" else None, 3.0)
    with torch.no_grad():
        full = model.forward_full(TOKENS)
        torch.testing.assert_close(full, hf_logits(path), atol=1e-4, rtol=1e-4)
        assert full.abs().max() <= 3.0  # the final cap bounds the logits
        use_kernels(model)
        cfg = model.config
        k = torch.zeros(cfg.num_layers, 2, cfg.num_kv_heads, 40, cfg.head_dim)
        v = torch.zeros_like(k)
        _, _, new_k, new_v = model.forward_step(TOKENS[:, :29], torch.tensor([0, 0]), 1, k, v,
                                                torch.zeros(2, 1, dtype=torch.long))
        k[:, :, :, :29], v[:, :, :, :29] = new_k, new_v
        logits, *_ = model.forward_step(TOKENS[:, 29:], torch.tensor([29, 29]), 29, k, v,
                                        torch.zeros(2, 1, dtype=torch.long))
    torch.testing.assert_close(logits[:, 0], full[:, 29], atol=1e-4, rtol=1e-4)


class Warnings(NullReporter):
    def __init__(self) -> None:
        self.said: list[str] = []

    def warn(self, message: str) -> None:
        self.said.append(message)


def test_gemma3_multimodal_checkpoint_runs_its_text_decoder(tmp_path):
    text = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=512, sliding_window=8,
                query_pre_attn_scalar=24)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    torch.manual_seed(0)
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.15)
    model.save_pretrained(tmp_path)
    said = Warnings()
    ours = load_model(tmp_path, torch.float32, reporter=said)
    assert ours.config.model_type == "gemma3_text" and ours.config.tie_word_embeddings
    assert len(said.said) == 1 and "vision_tower" in said.said[0] and "multi_modal_projector" in said.said[0]
    with torch.no_grad():
        expected = hf_logits(tmp_path, transformers.Gemma3ForConditionalGeneration)
        torch.testing.assert_close(ours.forward_full(TOKENS), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_gemma3_scaled_embedding_rounds_like_transformers(make_checkpoint, dtype):
    """sqrt(hidden) rounded to bfloat16 before the product, as transformers rounds it: logits bit for bit."""
    path = make_checkpoint("gemma3", dtype="bfloat16")
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()
    with torch.no_grad():
        expected = ref(TOKENS).logits.float()
        assert torch.equal(load_model(path, dtype).forward_full(TOKENS), expected)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_quantized_checkpoints_load_as_their_dequantized_weights(make_checkpoint, tmp_path, arch, dtype):
    """``neuronpack quantize`` of a Qwen3 / Gemma 3 checkpoint quantizes the projections (never the q / k norms, the
    four Gemma norms or the tied embedding); the portable model runs them (int8 kept int8, fp8 dequantized) and
    gives the logits of the float model holding the dequantized weights."""
    from safetensors import safe_open

    from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint
    from neuronpack.models.quant import Int8Linear
    from tests.convert.test_quantize_model import dequantized_state_dict

    path = make_checkpoint(arch)
    out = tmp_path / "quantized"
    quantize_checkpoint(path, out, QuantizeOptions(dtype))
    with safe_open(str(next(out.glob("*.safetensors"))), "pt") as fh:
        scaled = {n.removesuffix(".scale") for n in fh.keys() if n.endswith(".scale")}
    assert len(scaled) == 7 * 2 and not any("norm" in n or "embed" in n for n in scaled)  # 7 linears x 2 layers
    quantized = load_model(out, torch.float32)
    assert sum(isinstance(m, Int8Linear) for m in quantized.modules()) == (14 if dtype == "int8" else 0)
    reference = load_model(path, torch.float32)
    reference.load_state_dict({n: t.float() for n, t in dequantized_state_dict(out).items()}, strict=False)
    with torch.no_grad():
        torch.testing.assert_close(quantized.forward_full(TOKENS), reference.forward_full(TOKENS), atol=2e-3,
                                   rtol=2e-3)
