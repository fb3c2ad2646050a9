"""copy_aux_files copies exactly the tokenizer/generation files that exist, and nothing else."""

from __future__ import annotations

from neuronpack.checkpoint import AUX_FILES, copy_aux_files


def test_copies_existing_aux_files_only(tmp_path, tiny_llama):
    dst = tmp_path / "dst"
    copied = copy_aux_files(tiny_llama, dst)
    assert "tokenizer.json" in copied and "generation_config.json" in copied
    assert copied == [name for name in AUX_FILES if (tiny_llama / name).is_file()]
    assert sorted(p.name for p in dst.iterdir()) == sorted(copied)
    for name in copied:
        assert (dst / name).read_bytes() == (tiny_llama / name).read_bytes()
    assert not (dst / "model.safetensors").exists()
    assert copy_aux_files(tmp_path / "dst", tmp_path / "again") == copied
