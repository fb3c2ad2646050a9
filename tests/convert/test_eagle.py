"""convert_eagle on every draft layout: output checked tensor by tensor against the inputs read independently."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from neuronpack.convert.eagle import MANIFEST, convert_eagle, eagle_nxd_hints
from neuronpack.progress import NullReporter
from tests.convert.eagle_fixtures import (
    load_draft_tensors,
    load_output,
    make_eagle1_draft,
    make_eagle3_draft,
    target_tensor,
    vocab_of,
)


def _tree_state(root):
    return {p.name: (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest()) for p in root.iterdir()}


@pytest.mark.parametrize("fc_bias", [True, False])
def test_eagle1_bin_draft_gets_target_head_cast_to_draft_dtype(tmp_path, target, fc_bias):
    tgt = target("fp32")
    draft = make_eagle1_draft(tmp_path / "draft", vocab=vocab_of(tgt), layout="bin", fc_bias=fc_bias)
    before = _tree_state(draft)
    reporter = NullReporter()

    result = convert_eagle(draft, tgt, tmp_path / "out", reporter=reporter)

    out = load_output(tmp_path / "out")
    original = load_draft_tensors(draft)
    assert set(out) == set(original) | {"lm_head.weight"}
    for name, tensor in original.items():  # every draft tensor bit-identical
        assert out[name].dtype == tensor.dtype and torch.equal(out[name].view(torch.uint8), tensor.view(torch.uint8))
    # --dtype auto: the fp32 target head is cast to the draft's fp16, exactly as torch casts it.
    assert torch.equal(out["lm_head.weight"], target_tensor(tgt, "lm_head.weight").to(torch.float16))
    assert result.casts == ({"name": "lm_head.weight", "from": "F32", "to": "F16"},)
    assert any("cast lm_head.weight F32 -> F16" in w for w in reporter.warnings)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["fc_bias"] is fc_bias and config["bias"] is fc_bias and config["hidden_size"] == 64
    assert config["neuronpack_eagle"]["has_input_layernorm"] is False
    assert result.nxd_hints == {"enable_eagle_speculation": True, "enable_fused_speculation": True,
                                "enable_eagle_draft_input_norm": False, "is_eagle3": False, "fc_bias": fc_bias}
    assert _tree_state(draft) == before  # inputs never modified


def test_manifest_records_sources_and_changes(tmp_path, target):
    tgt = target("fp32")
    draft = make_eagle1_draft(tmp_path / "draft", vocab=vocab_of(tgt), layout="bin")
    convert_eagle(draft, tgt, tmp_path / "out")
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())

    assert manifest["layout"] == "eagle1" and manifest["dtype"] == {"requested": "auto", "output": "float16"}
    for side, root in (("draft", draft), ("target", tgt)):
        for entry in manifest[side]["files"]:
            assert entry["sha256"] == hashlib.sha256((root / entry["name"]).read_bytes()).hexdigest()
    assert {f["name"] for f in manifest["draft"]["files"]} == {"config.json", "pytorch_model.bin"}
    assert {f["name"] for f in manifest["target"]["files"]} == {"config.json", "model.safetensors"}
    assert manifest["added"][0] | {} == {"name": "lm_head.weight", "from": "lm_head.weight",
                                         "file": "model.safetensors", "dtype": "F16",
                                         "shape": [vocab_of(tgt), 64], "stored_in": "model.safetensors"}
    assert manifest["cast"] == [{"name": "lm_head.weight", "from": "F32", "to": "F16"}]
    assert manifest["renamed"] == {} and manifest["replaced_head"] is None


def test_sharded_bin_draft_with_sharded_bf16_target_and_sharded_output(tmp_path, target):
    tgt = target("bf16-sharded")
    assert (tgt / "model.safetensors.index.json").is_file()
    draft = make_eagle1_draft(tmp_path / "draft", vocab=vocab_of(tgt), layout="bin-sharded", dtype="bfloat16")

    result = convert_eagle(draft, tgt, tmp_path / "out", max_shard_bytes=40_000)

    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    out = load_output(tmp_path / "out")
    original = load_draft_tensors(draft)
    assert set(index["weight_map"]) == set(out) == set(original) | {"lm_head.weight"}
    for name, tensor in original.items():
        assert torch.equal(out[name].view(torch.uint8), tensor.view(torch.uint8))
    assert out["lm_head.weight"].dtype == torch.bfloat16
    assert torch.equal(out["lm_head.weight"], target_tensor(tgt, "lm_head.weight"))
    assert result.casts == ()


def test_safetensors_draft_with_tied_target_uses_the_embedding_as_head(tmp_path, target):
    tgt = target("tied")
    draft = make_eagle1_draft(tmp_path / "draft", vocab=vocab_of(tgt), layout="safetensors", dtype="float32",
                              input_norm=True)
    result = convert_eagle(draft, tgt, tmp_path / "out")

    out = load_output(tmp_path / "out")
    assert torch.equal(out["lm_head.weight"], target_tensor(tgt, "model.embed_tokens.weight"))
    assert result.added[0]["from"] == "model.embed_tokens.weight" and result.casts == ()
    assert result.nxd_hints["enable_eagle_draft_input_norm"] is True
    assert eagle_nxd_hints(tmp_path / "out") == result.nxd_hints


def test_eagle3_draft_renamed_drops_token_maps_keeps_head_and_gets_target_embedding(tmp_path, target):
    tgt = target("bf16-sharded")
    draft = make_eagle3_draft(tmp_path / "draft", vocab=vocab_of(tgt), layout="safetensors-sharded")
    result = convert_eagle(draft, tgt, tmp_path / "out")

    out = load_output(tmp_path / "out")
    original = load_draft_tensors(draft)
    renamed = {n: n.replace("midlayer.", "layers.0.", 1) for n in original}
    assert result.renamed == {k: v for k, v in renamed.items() if k != v}
    # NxDI never reads d2t / t2d (its draft vocabulary equals the target's): they are left out
    assert {"d2t", "t2d"} <= set(original)
    assert set(out) == (set(renamed.values()) - {"d2t", "t2d"}) | {"embed_tokens.weight"}
    for name, tensor in original.items():  # everything else, own lm_head included, kept bit for bit
        if name in ("d2t", "t2d"):
            continue
        assert out[renamed[name]].dtype == tensor.dtype
        assert torch.equal(out[renamed[name]].view(torch.uint8), tensor.view(torch.uint8))
    assert torch.equal(out["embed_tokens.weight"], target_tensor(tgt, "model.embed_tokens.weight"))
    assert result.layout == "eagle3" and result.added[0]["name"] == "embed_tokens.weight"
    assert result.nxd_hints["is_eagle3"] is True and result.nxd_hints["enable_eagle_draft_input_norm"] is True
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["draft_vocab_size"] == vocab_of(tgt) and config["architectures"] == ["LlamaForCausalLMEagle3"]


def test_explicit_dtype_casts_every_float_tensor_and_updates_config(tmp_path, target):
    tgt = target("bf16-sharded")
    draft = make_eagle3_draft(tmp_path / "draft", vocab=vocab_of(tgt), dtype="float16")
    result = convert_eagle(draft, tgt, tmp_path / "out", dtype="float32")

    out = load_output(tmp_path / "out")
    original = load_draft_tensors(draft)
    for name, tensor in original.items():
        if name in ("d2t", "t2d"):
            assert name not in out
            continue
        new = out[name.replace("midlayer.", "layers.0.", 1)]
        expected = tensor.to(torch.float32) if tensor.is_floating_point() else tensor
        assert new.dtype == expected.dtype and torch.equal(new, expected)
    assert torch.equal(out["embed_tokens.weight"], target_tensor(tgt, "model.embed_tokens.weight").float())
    cast_names = {c["name"] for c in result.casts}
    assert "d2t" not in cast_names and "t2d" not in cast_names and "layers.0.self_attn.q_proj.weight" in cast_names
    assert json.loads((tmp_path / "out" / "config.json").read_text())["torch_dtype"] == "float32"


@pytest.mark.parametrize("identical", [True, False])
def test_overwrite_head_reports_whether_the_old_head_was_identical(tmp_path, target, identical):
    tgt = target("fp32")
    draft = make_eagle1_draft(tmp_path / "draft", vocab=vocab_of(tgt), layout="safetensors", dtype="float32",
                              head=True)
    if identical:  # rewrite the draft's head as the target's own head
        from safetensors.torch import load_file, save_file

        tensors = load_file(draft / "model.safetensors")
        tensors["lm_head.weight"] = target_tensor(tgt, "lm_head.weight")
        save_file(tensors, str(draft / "model.safetensors"))
    reporter = NullReporter()
    result = convert_eagle(draft, tgt, tmp_path / "out", overwrite_head=True, reporter=reporter)

    assert result.head_identical is identical
    assert torch.equal(load_output(tmp_path / "out")["lm_head.weight"], target_tensor(tgt, "lm_head.weight"))
    word = "identical to" if identical else "different from"
    assert any(word in m for m in reporter.messages)
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert manifest["replaced_head"] == {"identical": identical}


def test_hints_of_a_draft_converted_by_hand_come_from_its_tensor_names(tmp_path, target):
    """A draft made with AWS's snippet (head added, no neuronpack section) still yields hints."""
    tgt = target("fp32")
    draft = make_eagle1_draft(tmp_path / "draft", vocab=vocab_of(tgt), layout="safetensors", head=True,
                              fc_bias=False)
    assert eagle_nxd_hints(draft) == {"enable_eagle_speculation": True, "enable_fused_speculation": True,
                                      "enable_eagle_draft_input_norm": False, "is_eagle3": False, "fc_bias": False}


def test_tokenizer_files_of_the_draft_are_copied(tmp_path, target):
    tgt = target("fp32")
    draft = make_eagle1_draft(tmp_path / "draft", vocab=vocab_of(tgt), layout="bin")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (draft / name).write_bytes((tgt / name).read_bytes())
    result = convert_eagle(draft, tgt, tmp_path / "out")
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (tgt / "tokenizer.json").read_bytes()
    assert set(result.files) == {"config.json", "model.safetensors", MANIFEST, "tokenizer.json",
                                 "tokenizer_config.json"}


def test_eagle1_draft_without_embedding_gets_the_targets(tmp_path, target):
    from tests.convert.eagle_fixtures import draft_config, eagle1_tensors, write_draft

    tgt = target("fp32")
    tensors = eagle1_tensors(64, vocab_of(tgt), fc_bias=True, dtype=torch.float32)
    del tensors["embed_tokens.weight"]
    draft = write_draft(tmp_path / "draft", tensors, draft_config(64, vocab_of(tgt), dtype="float32", bias=True),
                        layout="safetensors")
    result = convert_eagle(draft, tgt, tmp_path / "out")

    out = load_output(tmp_path / "out")
    assert torch.equal(out["embed_tokens.weight"], target_tensor(tgt, "model.embed_tokens.weight"))
    assert torch.equal(out["lm_head.weight"], target_tensor(tgt, "lm_head.weight"))
    assert [a["name"] for a in result.added] == ["embed_tokens.weight", "lm_head.weight"]


def test_overwrite_head_keeps_an_eagle3_drafts_trained_head(tmp_path, target):
    tgt = target("bf16-sharded")
    draft = make_eagle3_draft(tmp_path / "draft", vocab=vocab_of(tgt))
    reporter = NullReporter()
    result = convert_eagle(draft, tgt, tmp_path / "out", overwrite_head=True, reporter=reporter)
    assert result.head_identical is None
    assert torch.equal(load_output(tmp_path / "out")["lm_head.weight"], load_draft_tensors(draft)["lm_head.weight"])
    assert any("--overwrite-head ignored" in w for w in reporter.warnings)


@pytest.mark.parametrize("case", ["eagle1-tied-fp32", "eagle3-bf16-sharded", "eagle1-bf16-draft-fp32-head"])
def test_safetensors_inputs_convert_without_torch_as_torch_would_write_them(tmp_path, target, case):
    """Safetensors in: unchanged tensors are copied file to file, cast ones cast on their bytes (no torch import),
    and the files equal what the writer makes from the same tensors read and cast through torch (renamed EAGLE-3
    tensors, sharded output and a head cast F32 -> BF16 included)."""
    from neuronpack.checkpoint import TensorSpec, open_checkpoint, write_safetensors_sharded
    from neuronpack.checkpoint.dtypes import torch_dtype
    from neuronpack.convert.eagle_layouts import plan_eagle_conversion
    from tests.helpers.fresh_interpreter import run_fresh

    if case == "eagle1-tied-fp32":
        tgt = target("tied")
        draft = make_eagle1_draft(tmp_path / "draft", vocab=vocab_of(tgt), layout="safetensors", dtype="float32")
    elif case == "eagle3-bf16-sharded":
        tgt = target("bf16-sharded")
        draft = make_eagle3_draft(tmp_path / "draft", vocab=vocab_of(tgt), layout="safetensors", dtype="bfloat16")
    else:
        tgt = target("tied")
        draft = make_eagle1_draft(tmp_path / "draft", vocab=vocab_of(tgt), layout="safetensors", dtype="bfloat16")
    out, shard = tmp_path / "out", 40_000
    code = ("from pathlib import Path\nfrom neuronpack.convert.eagle import convert_eagle\n"
            f"r = convert_eagle(Path({str(draft)!r}), Path({str(tgt)!r}), Path({str(out)!r}), "
            f"max_shard_bytes={shard})\nprint(len(r.casts))")
    printed, torch_imported = run_fresh(code)
    assert printed == ("1" if case == "eagle1-bf16-draft-fp32-head" else "0") and not torch_imported

    draft_ckpt, target_ckpt = open_checkpoint(draft), open_checkpoint(tgt)
    plan = plan_eagle_conversion(draft_ckpt, target_ckpt)
    chunks = ((t.name, (draft_ckpt if t.source == "draft" else target_ckpt).get(t.source_name).to(torch_dtype(t.dtype)))
              for t in plan.tensors)
    (tmp_path / "ref").mkdir()
    specs = [TensorSpec(t.name, t.dtype, t.shape) for t in plan.tensors]
    written = write_safetensors_sharded(tmp_path / "ref", specs, chunks, max_shard_bytes=shard)
    assert len(written) > 1 or case == "eagle1-tied-fp32"
    for ref in (tmp_path / "ref").iterdir():
        assert (out / ref.name).read_bytes() == ref.read_bytes(), ref.name


def test_a_head_cast_in_many_chunks_with_a_nan_row_is_torchs_cast(tmp_path, target, monkeypatch):
    """Cast rows go in small chunks through two reused buffers; the chunk holding a NaN is cast by torch instead,
    between chunks cast on their bytes. Every value is torch's cast of the head (the NaN stays a NaN)."""
    import shutil

    from safetensors.torch import load_file, save_file

    import neuronpack.convert.eagle_stream as eagle_stream

    tgt = tmp_path / "target"
    shutil.copytree(target("tied"), tgt)  # fp32, the head is model.embed_tokens.weight
    tensors = load_file(tgt / "model.safetensors")
    head = tensors["model.embed_tokens.weight"]
    head[7, 3] = float("nan")
    save_file(tensors, str(tgt / "model.safetensors"), metadata={"format": "pt"})
    draft = make_eagle1_draft(tmp_path / "draft", vocab=vocab_of(tgt), layout="safetensors", dtype="bfloat16")
    monkeypatch.setattr(eagle_stream, "RAW_CHUNK_BYTES", 3 * head.shape[1] * 4)  # 3 rows of the fp32 head per chunk
    through_torch, get_rows = [], eagle_stream.Checkpoint.get_rows
    monkeypatch.setattr(eagle_stream.Checkpoint, "get_rows", lambda self, name, start, stop: (
        through_torch.append((start, stop)), get_rows(self, name, start, stop))[1])
    convert_eagle(draft, tgt, tmp_path / "out")
    assert through_torch == [(6, 9)]  # only the chunk holding row 7
    written, expected = load_output(tmp_path / "out")["lm_head.weight"], head.to(torch.bfloat16)
    nan = torch.isnan(expected)
    assert nan.sum() == 1 and torch.isnan(written[7, 3])
    assert torch.equal(written.view(torch.int16)[~nan], expected.view(torch.int16)[~nan])
