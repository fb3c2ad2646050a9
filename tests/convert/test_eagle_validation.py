"""Every refusal of convert_eagle: one ConversionError naming both values, raised before OUT exists."""

from __future__ import annotations

import json

import pytest
import torch

from neuronpack.convert.eagle import convert_eagle
from neuronpack.errors import ConversionError, NeuronpackError, OutputExistsError
from tests.convert.eagle_fixtures import (
    draft_config,
    eagle1_tensors,
    make_eagle1_draft,
    make_eagle3_draft,
    vocab_of,
    write_draft,
)


def _refused(draft, tgt, out, **kwargs) -> ConversionError:
    with pytest.raises(ConversionError) as info:
        convert_eagle(draft, tgt, out, **kwargs)
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".neuronpack-staging")]
    assert info.value.fix and "\n" not in info.value.one_line()
    return info.value


def test_hidden_size_mismatch_names_both_sizes(tmp_path, target):
    tgt = target("fp32")
    draft = make_eagle1_draft(tmp_path / "draft", hidden=32, vocab=vocab_of(tgt))
    err = _refused(draft, tgt, tmp_path / "out")
    assert "draft hidden size 32" in err.what and "target's 64" in err.what


def test_vocabulary_mismatch_names_both_sizes(tmp_path, target):
    tgt = target("fp32")
    vocab = vocab_of(tgt)
    draft = make_eagle1_draft(tmp_path / "draft", vocab=vocab + 10)
    err = _refused(draft, tgt, tmp_path / "out")
    assert f"draft vocabulary {vocab + 10}" in err.what and f"target's {vocab}" in err.what


def test_eagle1_fc_must_be_h_by_2h(tmp_path, target):
    tgt = target("fp32")
    tensors = eagle1_tensors(64, vocab_of(tgt), fc_bias=False, dtype=torch.float16)
    tensors["fc.weight"] = torch.zeros(64, 3 * 64, dtype=torch.float16)
    draft = write_draft(tmp_path / "draft", tensors, draft_config(64, vocab_of(tgt), dtype="float16", bias=False),
                        layout="safetensors")
    err = _refused(draft, tgt, tmp_path / "out")
    assert "fc.weight is [64, 192]" in err.what and "[64, 128]" in err.what


def test_eagle3_fc_must_be_h_by_3h(tmp_path, target):
    tgt = target("bf16-sharded")
    draft = make_eagle3_draft(tmp_path / "draft", vocab=vocab_of(tgt))
    from safetensors.torch import load_file, save_file

    tensors = load_file(draft / "model.safetensors")
    tensors["fc.weight"] = torch.zeros(64, 128, dtype=torch.bfloat16)
    save_file(tensors, str(draft / "model.safetensors"))
    err = _refused(draft, tgt, tmp_path / "out")
    assert "fc.weight is [64, 128]" in err.what and "EAGLE-3" in err.what and "[64, 192]" in err.what


def test_existing_head_is_refused_without_overwrite_head(tmp_path, target):
    tgt = target("fp32")
    draft = make_eagle1_draft(tmp_path / "draft", vocab=vocab_of(tgt), head=True)
    err = _refused(draft, tgt, tmp_path / "out")
    assert "already has lm_head.weight" in err.what and "--overwrite-head" in err.fix


def test_eagle3_reduced_draft_vocabulary_says_what_nxdi_cannot_accept(tmp_path, target):
    tgt = target("bf16-sharded")
    vocab = vocab_of(tgt)
    draft = make_eagle3_draft(tmp_path / "draft", vocab=vocab, draft_vocab=128)
    err = _refused(draft, tgt, tmp_path / "out")
    assert "vocabulary 128" in err.what and f"target's {vocab}" in err.what
    assert "NxDI requires draft_vocab_size == target vocab_size" in err.what and "d2t" in err.what


def test_quantized_target_head_is_refused(tmp_path, target):
    from safetensors.torch import save_file

    tgt = tmp_path / "int8-target"
    tgt.mkdir()
    (tgt / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "vocab_size": 100}))
    save_file({"model.embed_tokens.weight": torch.zeros(100, 64), "lm_head.weight": torch.zeros(100, 64,
               dtype=torch.int8), "lm_head.scale": torch.ones(100, 1)}, str(tgt / "model.safetensors"))
    draft = make_eagle1_draft(tmp_path / "draft", vocab=100)
    err = _refused(draft, tgt, tmp_path / "out")
    assert "target head lm_head.weight is I8" in err.what


def test_config_bias_must_agree_with_fc_bias_tensor(tmp_path, target):
    tgt = target("fp32")
    draft = make_eagle1_draft(tmp_path / "draft", vocab=vocab_of(tgt), fc_bias=False, config_bias=True)
    err = _refused(draft, tgt, tmp_path / "out")
    assert "bias=True" in err.what and "no fc.bias" in err.what


def test_a_plain_model_is_not_an_eagle_draft(tmp_path, target):
    tgt = target("fp32")
    err = _refused(tgt, tgt, tmp_path / "out")
    assert err.what.startswith("not an EAGLE draft")


def test_cast_that_overflows_float16_is_refused(tmp_path, target):
    from safetensors.torch import save_file

    tgt = tmp_path / "big-target"
    tgt.mkdir()
    (tgt / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "vocab_size": 100}))
    head = torch.zeros(100, 64)
    head[3, 5] = 1e6  # beyond float16's 65504
    save_file({"model.embed_tokens.weight": torch.zeros(100, 64), "lm_head.weight": head},
              str(tgt / "model.safetensors"))
    draft = make_eagle1_draft(tmp_path / "draft", vocab=100)
    err = _refused(draft, tgt, tmp_path / "out")
    assert "overflows when cast from F32 to F16" in err.what and "bfloat16" in err.fix


def test_unknown_dtype_is_refused(tmp_path, target):
    tgt = target("fp32")
    draft = make_eagle1_draft(tmp_path / "draft", vocab=vocab_of(tgt))
    err = _refused(draft, tgt, tmp_path / "out", dtype="int8")
    assert "unknown --dtype 'int8'" in err.what


def test_existing_out_and_out_inside_an_input_are_refused(tmp_path, target):
    tgt = target("fp32")
    draft = make_eagle1_draft(tmp_path / "draft", vocab=vocab_of(tgt))
    (tmp_path / "taken").mkdir()
    with pytest.raises(OutputExistsError):
        convert_eagle(draft, tgt, tmp_path / "taken")
    with pytest.raises(NeuronpackError, match="overlaps an input"):
        convert_eagle(draft, tgt, draft / "converted")
    assert not (draft / "converted").exists()


def test_uncached_hub_id_is_a_clear_error(tmp_path, target):
    from neuronpack.errors import ModelNotFoundError

    with pytest.raises(ModelNotFoundError):  # HF_HUB_OFFLINE=1 in tests/conftest.py
        convert_eagle("yuhuili/EAGLE-not-cached-here", target("fp32"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_hints_refuse_a_draft_without_head(tmp_path, target):
    from neuronpack.convert.eagle import eagle_nxd_hints

    draft = make_eagle1_draft(tmp_path / "draft", vocab=vocab_of(target("fp32")), layout="safetensors")
    with pytest.raises(ConversionError, match="no lm_head.weight") as info:
        eagle_nxd_hints(draft)
    assert "neuronpack convert-eagle" in info.value.fix
