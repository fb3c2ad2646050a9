"""quantize_checkpoint end to end on tiny real checkpoints: NxDI format, bounds, streaming, sharding, cache, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from neuronpack.convert import quant_stream
from neuronpack.convert.quant_math import error_bound
from neuronpack.convert.quantize import (
    RECORD_FILE,
    QuantizeOptions,
    nxd_quantization_fields,
    quantize_checkpoint,
    quantized_checkpoint_path,
)
from neuronpack.digest import sha256_stream
from neuronpack.errors import OutputExistsError, QuantizationError
from neuronpack.progress import NullReporter
from tests.helpers.fresh_interpreter import run_fresh


def load_dir(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a (possibly sharded) safetensors directory, read with the safetensors library itself."""
    tensors = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "pt") as fh:
            tensors.update({k: fh.get_tensor(k) for k in fh.keys()})
    return tensors


def tree_digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): sha256_stream(p) for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def bf16_llama(tmp_path_factory) -> Path:
    from tests.helpers.tiny_models import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("q") / "llama-bf16", arch="llama", dtype="bfloat16")


@pytest.mark.parametrize("dtype, granularity", [("int8", "per-channel"), ("fp8", "per-tensor")])
def test_output_matches_nxdi_format_and_bounds(bf16_llama, tmp_path, dtype, granularity):
    before = tree_digest(bf16_llama)
    out = tmp_path / "q"
    result = quantize_checkpoint(bf16_llama, out, QuantizeOptions(dtype, granularity))
    assert not result.cache_hit and result.out == out.absolute()
    assert tree_digest(bf16_llama) == before  # the input is never modified

    src, got = load_dir(bf16_llama), load_dir(out)
    qdtype = torch.int8 if dtype == "int8" else torch.float8_e4m3fn
    linear = [n for n in src if n.startswith("model.layers.") and n.endswith("_proj.weight")]
    assert len(linear) == 14
    expected_names = set(src) | {n.removesuffix(".weight") + ".scale" for n in linear}
    assert set(got) == expected_names
    for name, w in src.items():
        if name not in linear:
            assert got[name].dtype == w.dtype and torch.equal(got[name], w), name  # kept bit for bit
            continue
        q, scale = got[name], got[name.removesuffix(".weight") + ".scale"]
        assert q.dtype == qdtype and q.shape == w.shape
        assert scale.dtype == torch.float32
        assert scale.shape == ((w.shape[0], 1) if granularity == "per-channel" else (1,))
        deq = q.float() * scale
        assert torch.all((w.float() - deq).abs() <= error_bound(w, scale, dtype)), name

    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["method"] == "neuronpack-symmetric"
    assert config["quantization"]["dtype"] == dtype and config["quantization"]["granularity"] == granularity
    assert config["quantization"]["modules_to_not_convert"] == ["lm_head"]
    assert config["hidden_size"] == 64
    for aux in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        assert (out / aux).read_bytes() == (bf16_llama / aux).read_bytes()


def test_report_figures_match_a_recomputation(bf16_llama, tmp_path):
    out = tmp_path / "q"
    result = quantize_checkpoint(bf16_llama, out, QuantizeOptions("int8"))
    report = json.loads((out / "quantization_report.json").read_text())
    src, got = load_dir(bf16_llama), load_dir(out)
    signal = noise = 0.0
    for row in report["tensors"]:
        w = src[row["name"]].float()
        deq = got[row["name"]].float() * got[row["name"].removesuffix(".weight") + ".scale"]
        rel = (torch.linalg.norm(w - deq) / torch.linalg.norm(w)).item()
        assert row["relative_error"] == pytest.approx(rel, rel=1e-4)
        signal += w.double().square().sum().item()
        noise += (w - deq).double().square().sum().item()
    assert report["model"]["relative_error"] == pytest.approx((noise / signal) ** 0.5, rel=1e-6)
    assert result.summary["snr_db"] == pytest.approx(report["model"]["snr_db"])
    assert 0 < result.summary["relative_error"] < 0.01  # int8 per-channel on Gaussian weights: ~0.5%
    assert result.summary["output_bytes"] < result.summary["input_bytes"]


def test_streaming_in_row_chunks_and_shards_gives_identical_tensors(bf16_llama, tmp_path, monkeypatch):
    for granularity in ("per-channel", "per-tensor"):
        whole = tmp_path / f"whole-{granularity}"
        quantize_checkpoint(bf16_llama, whole, QuantizeOptions("int8", granularity))
        with monkeypatch.context() as patch:
            patch.setattr(quant_stream, "CHUNK_ELEMENTS", 1000)  # ~15 rows per chunk: many chunks per matrix
            chunked = tmp_path / f"chunked-{granularity}"
            quantize_checkpoint(bf16_llama, chunked, QuantizeOptions("int8", granularity), max_shard_bytes=40_000)
        index = json.loads((chunked / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 2
        a, b = load_dir(whole), load_dir(chunked)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_skip_is_honoured_per_tensor_and_unmatched_globs_warn(bf16_llama, tmp_path):
    reporter = NullReporter()
    options = QuantizeOptions("fp8", "per-tensor", skip=("layers.1.mlp", "*.0.self_attn.k_proj", "missing.*"))
    quantize_checkpoint(bf16_llama, tmp_path / "q", options, reporter=reporter)
    got = load_dir(tmp_path / "q")
    assert got["model.layers.1.mlp.up_proj.weight"].dtype == torch.bfloat16
    assert "model.layers.1.mlp.up_proj.scale" not in got
    assert got["model.layers.0.self_attn.k_proj.weight"].dtype == torch.bfloat16
    assert got["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    assert config["quantization"]["modules_to_not_convert"] == ["layers.0.self_attn.k_proj", "layers.1.mlp",
                                                                "lm_head"]
    assert reporter.warnings == ["--skip 'missing.*' matches no Linear module; nothing was skipped for it"]


def test_include_lm_head(make_checkpoint, tmp_path):
    untied = make_checkpoint("llama", tie=False)
    quantize_checkpoint(untied, tmp_path / "q", QuantizeOptions("int8", include_lm_head=True))
    got = load_dir(tmp_path / "q")
    assert got["lm_head.weight"].dtype == torch.int8
    assert got["lm_head.scale"].shape == (got["lm_head.weight"].shape[0], 1)
    assert got["model.embed_tokens.weight"].dtype == torch.float32



def test_include_lm_head_unties_a_tied_head(make_checkpoint, tmp_path):
    """A tied head is quantized from the embedding matrix into its own lm_head; the embedding stays float for the
    token lookup, the config says untied, and NxDI's modules_to_not_convert no longer lists lm_head."""
    tied, reporter = make_checkpoint("smollm"), NullReporter()
    result = quantize_checkpoint(tied, tmp_path / "t", QuantizeOptions("int8", include_lm_head=True),
                                 reporter=reporter)
    got, source = load_dir(tmp_path / "t"), load_dir(tied)
    assert "lm_head.weight" not in source and reporter.warnings == []
    embed = source["model.embed_tokens.weight"]
    assert torch.equal(got["model.embed_tokens.weight"], embed)
    assert got["lm_head.weight"].dtype == torch.int8 and got["lm_head.weight"].shape == embed.shape
    dequantized = got["lm_head.weight"].float() * got["lm_head.scale"]
    assert (dequantized - embed.float()).abs().max() <= got["lm_head.scale"].max() / 2 + 1e-7
    config = json.loads((tmp_path / "t" / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    assert "lm_head" not in config["quantization"]["modules_to_not_convert"]
    assert any(t["name"] == "lm_head.weight" for t in json.loads(
        (tmp_path / "t" / "quantization_report.json").read_text())["tensors"])
    plain = quantize_checkpoint(tied, tmp_path / "p", QuantizeOptions("int8"))
    assert plain.key != result.key and "lm_head.weight" not in load_dir(tmp_path / "p")


def test_same_inputs_are_a_cache_hit_and_different_ones_are_refused(bf16_llama, tmp_path):
    out = tmp_path / "q"
    first = quantize_checkpoint(bf16_llama, out, QuantizeOptions("int8", skip=("b", "a")))
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    again = quantize_checkpoint(bf16_llama, out, QuantizeOptions("int8", skip=("a", "b")))  # skip order is no change
    assert again.cache_hit and again.key == first.key and again.summary == first.summary
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    assert json.loads((out / RECORD_FILE).read_text())["key"] == first.key
    with pytest.raises(OutputExistsError, match="different inputs or options"):
        quantize_checkpoint(bf16_llama, out, QuantizeOptions("int8", "per-tensor"))
    (out / "model.safetensors").write_bytes(b"truncated")
    with pytest.raises(OutputExistsError, match="incomplete or modified"):
        quantize_checkpoint(bf16_llama, out, QuantizeOptions("int8", skip=("a", "b")))
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(OutputExistsError, match="not a neuronpack quantized checkpoint"):
        quantize_checkpoint(bf16_llama, plain, QuantizeOptions("int8"))


def test_bad_inputs_leave_nothing_behind(bf16_llama, tmp_path):
    quantized = tmp_path / "q"
    quantize_checkpoint(bf16_llama, quantized, QuantizeOptions("int8"))
    with pytest.raises(QuantizationError, match="already quantized"):
        quantize_checkpoint(quantized, tmp_path / "again", QuantizeOptions("int8"))
    with pytest.raises(QuantizationError, match="unknown quantization dtype 'int4'"):
        QuantizeOptions("int4")
    with pytest.raises(QuantizationError, match="unknown granularity"):
        QuantizeOptions("int8", granularity="per-group")
    with pytest.raises(QuantizationError, match="nothing left to quantize"):
        quantize_checkpoint(bf16_llama, tmp_path / "none", QuantizeOptions("int8", skip=("*",)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q"]  # no partial outputs, no staging leftovers


def test_quantized_checkpoint_path_is_keyed_and_torch_free(bf16_llama, tmp_path):
    options = QuantizeOptions("int8")
    path = quantized_checkpoint_path(tmp_path, bf16_llama, options)
    result = quantize_checkpoint(bf16_llama, path, options)
    assert path == tmp_path / "quantized-checkpoints" / result.key
    assert quantized_checkpoint_path(tmp_path, bf16_llama, QuantizeOptions("fp8")) != path
    code = (
        "from pathlib import Path; from neuronpack.convert.quantize import QuantizeOptions, "
        f"quantized_checkpoint_path as q; print(q(Path('{tmp_path}'), Path('{bf16_llama}'), "
        "QuantizeOptions('int8')).name)"
    )
    out, torch_imported = run_fresh(code)
    assert out == result.key and not torch_imported


def test_nxd_quantization_fields(bf16_llama, tmp_path):
    options = QuantizeOptions("fp8", "per-tensor", skip=("layers.0.mlp",))
    result = quantize_checkpoint(bf16_llama, tmp_path / "q", options)
    assert nxd_quantization_fields(options, result.out) == {
        "quantized": True,
        "quantized_checkpoints_path": str(result.out),
        "quantization_type": "per_tensor_symmetric",
        "quantization_dtype": "f8e4m3",
        "modules_to_not_convert": ["layers.0.mlp", "lm_head"],
    }
    assert nxd_quantization_fields(QuantizeOptions("int8", include_lm_head=True)) == {
        "quantized": True,
        "quantized_checkpoints_path": None,
        "quantization_type": "per_channel_symmetric",
        "quantization_dtype": "int8",
        "modules_to_not_convert": [],
    }


def poison(src: Path, dest: Path, name: str, index: tuple[int, int], value: float) -> Path:
    """A copy of the checkpoint ``src`` whose tensor ``name`` holds ``value`` (NaN, inf) at ``index``."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dest)
    tensors = load_file(str(dest / "model.safetensors"))
    tensors[name][index] = value
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


@pytest.mark.parametrize("dtype, granularity, name, index, value", [
    ("int8", "per-channel", "model.layers.1.self_attn.q_proj.weight", (37, 5), float("nan")),
    ("int8", "per-tensor", "model.layers.0.mlp.down_proj.weight", (21, 0), float("inf")),
    ("fp8", "per-channel", "model.layers.0.mlp.up_proj.weight", (90, 63), float("-inf")),
])
def test_nonfinite_weights_are_refused_naming_the_first_bad_index(tiny_llama, tmp_path, monkeypatch, dtype,
                                                                  granularity, name, index, value):
    bad = poison(tiny_llama, tmp_path / "bad", name, index, value)
    monkeypatch.setattr(quant_stream, "CHUNK_ELEMENTS", 1000)  # several chunks per matrix: the index is global
    out = tmp_path / "out" / "q"
    out.parent.mkdir()
    with pytest.raises(QuantizationError) as err:
        quantize_checkpoint(bad, out, QuantizeOptions(dtype, granularity))
    assert err.value.what.startswith(f"tensor {name} holds {value} at index [{index[0]}, {index[1]}]")
    assert err.value.where == str(bad)
    assert list(out.parent.iterdir()) == []  # no output, no staging directory


def test_nonfinite_tied_embedding_is_refused_when_untied_into_the_head(tmp_path, make_checkpoint):
    tied = make_checkpoint(arch="llama", tie=True)
    bad = poison(tied, tmp_path / "bad", "model.embed_tokens.weight", (300, 7), float("nan"))
    with pytest.raises(QuantizationError, match=r"tensor model.embed_tokens.weight holds nan at index \[300, 7\]"):
        quantize_checkpoint(bad, tmp_path / "q", QuantizeOptions("int8", include_lm_head=True))
    assert not (tmp_path / "q").exists()
