"""Fuzz the input validation of convert-eagle and quantize with real checkpoints written from generated headers:
valid EAGLE-1/2 / EAGLE-3 drafts and Llama checkpoints, then broken in generated ways (a shape or dtype changed, a
tensor dropped or added, config.json values of the wrong type or size, tensor data full of NaN/inf). Each run either
writes a checkpoint that opens or raises a NeuronpackError (one line) with no output and no staging left."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from neuronpack.checkpoint import open_checkpoint
from neuronpack.convert.eagle import convert_eagle
from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint
from neuronpack.errors import NeuronpackError

from . import assert_one_line, fuzz_settings
from .synthetic import BF16, H, V, eagle_dtypes, eagle_shapes, llama_config, llama_shapes, write_checkpoint

odd_values = st.sampled_from([None, True, False, 0, -1, 1, H, 2 * H, V, V + 1, 10**9, 1.5, "8", "x", [], [H], {}])
shape_changes = st.sampled_from([(), (0,), (1,), (H,), (V,), (H, H), (H, 2 * H), (H, 3 * H), (V, H), (V + 1, H),
                                 (H, H, 1), (0, H)])
dtypes = st.sampled_from(["F32", "F16", BF16, "I8", "I64", "BOOL", "I32"])


@st.composite
def broken_checkpoint(draw, shapes: dict, config: dict, float_dtype: str, dtype_of=lambda name, d: d):
    """(tensors, config, fill): a valid checkpoint with 0-3 generated faults."""
    tensors = {n: (dtype_of(n, float_dtype), s) for n, s in shapes.items()}
    config = dict(config)
    for _ in range(draw(st.integers(0, 3))):
        fault = draw(st.sampled_from(["shape", "dtype", "drop", "add", "config"]))
        names = sorted(tensors)
        if fault == "shape" and names:
            name = draw(st.sampled_from(names))
            tensors[name] = (tensors[name][0], draw(shape_changes))
        elif fault == "dtype" and names:
            name = draw(st.sampled_from(names))
            tensors[name] = (draw(dtypes), tensors[name][1])
        elif fault == "drop" and len(names) > 1:
            del tensors[draw(st.sampled_from(names))]
        elif fault == "add":
            name = draw(st.sampled_from(["lm_head.weight", "d2t", "t2d", "midlayer.x.weight", "layers.0.input_layernorm"
                                         ".weight", "model.layers.0.mlp.up_proj.scale", "embed_tokens.weight",
                                         "model.embed_tokens.weight"]))
            tensors[name] = (draw(dtypes), draw(shape_changes))
        else:
            key = draw(st.sampled_from(["hidden_size", "vocab_size", "bias", "tie_word_embeddings",
                                        "quantization_config", "text_config", "draft_vocab_size"]))
            config[key] = draw(odd_values)
    fill = draw(st.sampled_from(["random", "random", "zeros", "nan", "inf"]))
    return tensors, config, fill


def run_or_refuse(call, out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    try:
        result = call()
    except NeuronpackError as exc:
        assert_one_line(exc)
        event(f"refused: {type(exc).__name__}: {exc.what[:40]}")
        assert not out.exists(), "a refused run left its output"
        assert not [p for p in out.parent.iterdir() if p.name.startswith(".neuronpack-staging")]
        return
    assert result is not None
    event("written")
    open_checkpoint(out)


@fuzz_settings(60)
@given(layout=st.sampled_from(["eagle1", "eagle3"]), float_dtype=st.sampled_from(["F32", "F16", BF16]),
       data=st.data(), dtype=st.sampled_from(["auto", "auto", "float16", "bfloat16", "float32", "int8"]),
       overwrite_head=st.booleans(), tied=st.booleans())
def test_eagle_inputs(tmp_path, layout, float_dtype, data, dtype, overwrite_head, tied):
    base = {"hidden_size": H, "vocab_size": V, "bias": layout == "eagle1", "model_type": "llama"}
    draft_t, draft_c, fill = data.draw(broken_checkpoint(eagle_shapes(layout), base, float_dtype, eagle_dtypes),
                                       label="draft")
    target_t, target_c, target_fill = data.draw(
        broken_checkpoint(llama_shapes(tied=tied), llama_config(tied), "F32"), label="target")
    draft = write_checkpoint(tmp_path / "draft", draft_t, draft_c, fill=fill)
    target = write_checkpoint(tmp_path / "target", target_t, target_c, fill=target_fill, seed=1)
    out = tmp_path / "out"
    run_or_refuse(lambda: convert_eagle(draft, target, out, dtype=dtype, overwrite_head=overwrite_head), out)


@fuzz_settings(60)
@given(data=st.data(), tied=st.booleans(), float_dtype=st.sampled_from(["F32", "F16", BF16]),
       qdtype=st.sampled_from(["int8", "fp8"] * 4 + ["int4", ""]),
       granularity=st.sampled_from(["per-channel", "per-tensor"] * 4 + ["per-row"]),
       skip=st.lists(st.sampled_from(["layers.0", "*", "model.layers.1.mlp", "*.q_proj", "[", "", "lm_head"]),
                     max_size=2),
       include_lm_head=st.booleans())
def test_quantize_inputs(tmp_path, data, tied, float_dtype, qdtype, granularity, skip, include_lm_head):
    tensors, config, fill = data.draw(broken_checkpoint(llama_shapes(tied=tied), llama_config(tied), float_dtype))
    model = write_checkpoint(tmp_path / "model", tensors, config, fill=fill)
    out = tmp_path / "out"

    def call():
        options = QuantizeOptions(dtype=qdtype, granularity=granularity, skip=tuple(skip),
                                  include_lm_head=include_lm_head)
        return quantize_checkpoint(model, out, options)

    run_or_refuse(call, out)


# --- regressions found by the fuzzers above (each was a raw IndexError / TypeError / ValueError traceback) -----------
def refused(call, out: Path) -> NeuronpackError:
    """The error ``call()`` raises: one line, nothing written at ``out``."""
    with pytest.raises(NeuronpackError) as info:
        call()
    assert_one_line(info.value)
    assert not out.exists()
    return info.value


def _eagle_case(tmp_path, draft_changes: dict, target_changes: dict, *, layout: str = "eagle1",
                config: dict | None = None) -> NeuronpackError:
    draft_t = {n: (eagle_dtypes(n, "F32"), s) for n, s in eagle_shapes(layout).items()} | draft_changes
    draft_t = {n: v for n, v in draft_t.items() if v is not None}
    target_t = {n: ("F32", s) for n, s in llama_shapes().items()} | target_changes
    config = config or {"hidden_size": H, "vocab_size": V, "bias": layout == "eagle1"}
    draft = write_checkpoint(tmp_path / "draft", draft_t, config)
    target = write_checkpoint(tmp_path / "target", target_t, llama_config())
    return refused(lambda: convert_eagle(draft, target, tmp_path / "out"), tmp_path / "out")


def test_eagle_target_head_that_is_not_a_matrix(tmp_path):
    err = _eagle_case(tmp_path, {}, {"lm_head.weight": ("F32", (V,))})
    assert "target head lm_head.weight has shape [16], not a [rows, hidden] matrix" in err.what


def test_eagle_draft_embedding_that_is_not_a_matrix(tmp_path):
    err = _eagle_case(tmp_path, {"embed_tokens.weight": ("F32", ())}, {})
    assert "draft embed_tokens.weight has shape []" in err.what


def test_eagle_target_embedding_that_does_not_match_its_head(tmp_path):
    err = _eagle_case(tmp_path, {"embed_tokens.weight": None}, {"model.embed_tokens.weight": ("F32", (V + 1, H))})
    assert "does not match its head [16, 8]" in err.what


def test_eagle_config_hidden_size_null(tmp_path):
    """hidden_size null in the draft's config.json raised TypeError (int * None)."""
    err = _eagle_case(tmp_path, {}, {}, config={"hidden_size": None, "bias": True})
    assert "hidden_size None needs [H, 2H]" in err.what


def test_eagle3_with_both_namings_of_a_layer(tmp_path):
    """midlayer.X and layers.0.X in one EAGLE-3 draft collided after renaming (ValueError in the writer, after the
    output staging directory was made)."""
    err = _eagle_case(tmp_path, {"layers.0.input_layernorm.weight": ("F32", (H,))}, {}, layout="eagle3")
    assert "both midlayer.* and layers.0.* names for layers.0.input_layernorm.weight" in err.what


def _quantize_case(tmp_path, changes: dict, **options) -> NeuronpackError:
    tensors = {n: ("F32", s) for n, s in llama_shapes().items()} | changes
    model = write_checkpoint(tmp_path / "model", tensors, llama_config())
    return refused(lambda: quantize_checkpoint(model, tmp_path / "out", QuantizeOptions("int8", **options)),
                   tmp_path / "out")


def test_quantize_lm_head_that_is_not_a_matrix(tmp_path):
    err = _quantize_case(tmp_path, {"lm_head.weight": ("F16", (H,))}, include_lm_head=True)
    assert "lm_head.weight is F16 [8], not a float [vocab, hidden] matrix" in err.what


def test_quantize_empty_linear_weight(tmp_path):
    err = _quantize_case(tmp_path, {"model.layers.0.input_layernorm.weight": ("F32", (0, H))})
    assert "model.layers.0.input_layernorm.weight is empty (shape [0, 8])" in err.what
