"""open_checkpoint / Checkpoint: every layout reads the same tensors transformers loads; bad inputs get one clear
CheckpointError naming the file."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import save_file

from neuronpack.checkpoint import Checkpoint, open_checkpoint
from neuronpack.errors import CheckpointError


def reference_state(path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path).state_dict()


def to_bin(src, dst, *, shards=1):
    """Rewrite a safetensors checkpoint as pytorch_model.bin (sharded with an index when shards > 1)."""
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    state = dict(open_checkpoint(src).iter_tensors())
    if shards == 1:
        torch.save(state, dst / "pytorch_model.bin")
        return dst
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        part = names[i::shards]
        fname = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        torch.save({n: state[n] for n in part}, dst / fname)
        weight_map.update(dict.fromkeys(part, fname))
    (dst / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


def assert_matches_transformers(ckpt: Checkpoint, ref: dict):
    names = set(ckpt.names())
    for name, tensor in ref.items():
        if name not in names:
            assert ckpt.tied and name == "lm_head.weight"
            continue
        torch.testing.assert_close(ckpt.get(name), tensor, rtol=0, atol=0)
    assert names <= set(ref)


@pytest.mark.parametrize("layout", ["single", "sharded", "bin", "bin-sharded"])
def test_layouts_read_like_transformers(tmp_path, make_checkpoint, tiny_llama, layout):
    if layout == "single":
        path = tiny_llama
    elif layout == "sharded":
        path = make_checkpoint("llama", max_shard_size="40KB")
    else:
        path = to_bin(tiny_llama, tmp_path / "bin", shards=1 if layout == "bin" else 3)
    ckpt = open_checkpoint(path)
    assert ckpt.format == ("bin" if layout.startswith("bin") else "safetensors")
    if layout.endswith("sharded"):
        assert len(ckpt.files) > 1
    assert ckpt.config["model_type"] == "llama"
    assert_matches_transformers(ckpt, reference_state(tiny_llama if layout.startswith("bin") else path))
    info = ckpt.info("model.layers.0.self_attn.q_proj.weight")
    assert (info.dtype, info.shape, info.nbytes) == ("F32", (64, 64), 64 * 64 * 4)
    assert info.file in ckpt.files


def test_get_rows_reads_a_slice(tiny_llama):
    ckpt = open_checkpoint(tiny_llama)
    full = ckpt.get("lm_head.weight")
    torch.testing.assert_close(ckpt.get_rows("lm_head.weight", 10, 20), full[10:20], rtol=0, atol=0)
    assert ckpt.get_rows("lm_head.weight", 5, 5).shape == (0, full.shape[1])
    with pytest.raises(ValueError, match="out of range"):
        ckpt.get_rows("lm_head.weight", 0, full.shape[0] + 1)


def test_raw_rows_are_the_stored_bytes_also_read_into_a_buffer(tiny_llama):
    ckpt = open_checkpoint(tiny_llama)
    expected = ckpt.get_rows("lm_head.weight", 10, 20).numpy().tobytes()
    assert ckpt.raw_rows("lm_head.weight", 10, 20) == expected
    buffer = bytearray(len(expected) + 100)  # larger than the rows: a view of its start is returned
    view = ckpt.raw_rows("lm_head.weight", 10, 20, into=buffer)
    assert isinstance(view, memoryview) and view.obj is buffer and bytes(view) == expected
    with pytest.raises(ValueError, match="no stored rows"):
        ckpt.raw_rows("lm_head.weight", 0, 10**6)
    with pytest.raises(ValueError, match="cannot hold"):
        ckpt.raw_rows("lm_head.weight", 10, 20, into=bytearray(8))


def test_get_rows_on_bin(tmp_path, tiny_llama):
    ckpt = open_checkpoint(to_bin(tiny_llama, tmp_path / "bin"))
    full = ckpt.get("lm_head.weight")
    torch.testing.assert_close(ckpt.get_rows("lm_head.weight", 3, 7), full[3:7], rtol=0, atol=0)


def test_tied_and_untied_lm_head(make_checkpoint, tiny_llama):
    tied = open_checkpoint(make_checkpoint("smollm"))
    assert tied.tied and "lm_head.weight" not in tied.names()
    assert tied.lm_head_name() == "model.embed_tokens.weight"
    untied = open_checkpoint(tiny_llama)
    assert not untied.tied and untied.lm_head_name() == "lm_head.weight"


def test_tied_inferred_when_config_is_silent(tmp_path, make_checkpoint):
    path = make_checkpoint("smollm")
    config = json.loads((path / "config.json").read_text())
    config.pop("tie_word_embeddings", None)
    (path / "config.json").write_text(json.dumps(config))
    assert open_checkpoint(path).tied


def test_weight_identity_is_sorted_and_torch_free_for_safetensors(tiny_llama):
    ident = open_checkpoint(tiny_llama).weight_identity()
    assert [row[0] for row in ident] == sorted(row[0] for row in ident)
    assert ["model.norm.weight", "F32", [64]] in ident
    json.dumps(ident)  # goes into the artifact key


def test_iter_tensors_subset_in_given_order(tiny_llama):
    ckpt = open_checkpoint(tiny_llama)
    names = ["model.norm.weight", "model.embed_tokens.weight"]
    assert [n for n, _ in ckpt.iter_tensors(names)] == names
    assert len(list(ckpt.iter_tensors())) == len(ckpt.names())


def test_unknown_tensor_name(tiny_llama):
    with pytest.raises(CheckpointError, match="no tensor named"):
        open_checkpoint(tiny_llama).get("model.nope.weight")


def copy_ckpt(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_dir_and_file_instead_of_dir(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist") as err:
        open_checkpoint(tmp_path / "nope")
    assert str(tmp_path / "nope") in err.value.where
    (tmp_path / "f").write_text("x")
    with pytest.raises(CheckpointError, match="not a directory"):
        open_checkpoint(tmp_path / "f")


@pytest.mark.parametrize(("content", "message"), [(None, "missing"), ("{not json", "not valid JSON"),
                                                   ("[1, 2]", "not a JSON object")])
def test_bad_config(tmp_path, tiny_llama, content, message):
    path = copy_ckpt(tiny_llama, tmp_path / "m")
    if content is None:
        (path / "config.json").unlink()
    else:
        (path / "config.json").write_text(content)
    with pytest.raises(CheckpointError, match=message):
        open_checkpoint(path)


def test_no_weight_files(tmp_path, tiny_llama):
    path = copy_ckpt(tiny_llama, tmp_path / "m")
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weight files") as err:
        open_checkpoint(path)
    assert "config.json" in err.value.where


def test_truncated_safetensors_in_checkpoint(tmp_path, tiny_llama):
    path = copy_ckpt(tiny_llama, tmp_path / "m")
    weights = path / "model.safetensors"
    os.truncate(weights, weights.stat().st_size - 10)
    with pytest.raises(CheckpointError, match="truncated: expected") as err:
        open_checkpoint(path)
    assert str(weights) in err.value.where


def test_index_naming_missing_shard(make_checkpoint):
    path = make_checkpoint("llama", max_shard_size="40KB")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    second = sorted(set(index["weight_map"].values()))[1]
    (path / second).unlink()
    with pytest.raises(CheckpointError, match=f"missing shard {second}"):
        open_checkpoint(path)


def test_duplicate_names_across_shards(make_checkpoint):
    path = make_checkpoint("llama", max_shard_size="40KB")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    # Put a tensor that already lives in shard 1 into shard 2 as well.
    first = next(n for n, f in index["weight_map"].items() if f == shards[0])
    ckpt = open_checkpoint(path)
    extra = {n: ckpt.get(n) for n in ckpt.names() if index["weight_map"][n] == shards[1]}
    extra[first] = ckpt.get(first)
    save_file(extra, path / shards[1], metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"duplicate tensor name '{first}'"):
        open_checkpoint(path)


def test_index_disagrees_with_shards(make_checkpoint):
    path = make_checkpoint("llama", max_shard_size="40KB")
    index_path = path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["ghost.weight"] = next(iter(index["weight_map"].values()))
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="ghost.weight"):
        open_checkpoint(path)


class Exploit:
    """Unpickling this would run a shell command."""

    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_bin_with_pickled_callable_is_refused(tmp_path, tiny_llama):
    path = tmp_path / "evil"
    path.mkdir()
    shutil.copy(tiny_llama / "config.json", path / "config.json")
    torch.save({"model.embed_tokens.weight": torch.zeros(2, 2), "payload": Exploit()}, path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="unsafe pickle.*posix.system") as err:
        open_checkpoint(path).names()
    assert "safetensors" in err.value.fix
    assert str(path / "pytorch_model.bin") in err.value.where


def test_bin_that_is_not_a_zip(tmp_path, tiny_llama):
    path = tmp_path / "junk"
    path.mkdir()
    shutil.copy(tiny_llama / "config.json", path / "config.json")
    (path / "pytorch_model.bin").write_bytes(b"garbage" * 10)
    with pytest.raises(CheckpointError, match="pytorch_model.bin|unsafe|cannot read"):
        open_checkpoint(path).names()


def test_open_checkpoint_and_identity_do_not_import_torch(tiny_llama):
    from tests.helpers.fresh_interpreter import run_fresh

    code = (
        "from neuronpack.checkpoint import open_checkpoint;"
        f"c = open_checkpoint({str(tiny_llama)!r}); c.weight_identity(); c.lm_head_name(); c.tied"
    )
    _, torch_imported = run_fresh(code)
    assert not torch_imported
