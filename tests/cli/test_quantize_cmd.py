"""`neuronpack quantize` through the real typer app: stdout/stderr contract, JSON output, cache hit, error lines."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from neuronpack.cli.app import app


@pytest.fixture
def run(monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    runner = CliRunner()

    def _run(*args: str):
        return runner.invoke(app, ["quantize", *map(str, args)])

    return _run


def test_text_output_prints_table_on_stderr_and_path_on_stdout(run, tiny_llama, tmp_path):
    out = tmp_path / "q"
    result = run(tiny_llama, "--out", out, "--dtype", "int8", "--skip", "layers.0.mlp", "--skip", "zzz*")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == str(out.absolute())
    assert "int8 per-channel: 11 tensors quantized" in result.stderr
    assert "model.layers.1.mlp.down_proj.weight" in result.stderr and "whole model" in result.stderr
    assert "left unquantized (modules_to_not_convert): layers.0.mlp, lm_head" in result.stderr
    assert "warning: --skip 'zzz*' matches no Linear module" in result.stderr
    assert (out / "quantization_report.json").is_file() and (out / "model.safetensors").is_file()


def test_json_output_is_one_object_and_rerun_is_a_cache_hit(run, tiny_llama, tmp_path):
    out = tmp_path / "q"
    first = run(tiny_llama, "--out", out, "--dtype", "fp8", "--granularity", "per-tensor", "--format", "json")
    assert first.exit_code == 0, first.output
    summary = json.loads(first.stdout)
    assert summary["cache_hit"] is False and summary["out"] == str(out.absolute())
    assert summary["dtype"] == "fp8" and summary["granularity"] == "per-tensor"
    assert summary["quantized_tensors"] == 14 and summary["modules_to_not_convert"] == ["lm_head"]
    assert 20 < summary["snr_db"] < 40 and summary["worst_tensor"]["name"].endswith(".weight")
    again = run(tiny_llama, "--out", out, "--dtype", "fp8", "--granularity", "per-tensor", "--format", "json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout) == {**summary, "cache_hit": True}
    assert "cache hit" in again.stderr


def test_quiet_prints_only_the_path(run, tiny_llama, tmp_path):
    result = run(tiny_llama, "--out", tmp_path / "q", "--dtype", "int8", "--quiet")
    assert result.exit_code == 0, result.output
    assert result.stderr == "" and result.stdout.strip() == str((tmp_path / "q").absolute())


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--dtype", "int8", "--skip", "*"], "error: every Linear weight is excluded by --skip"),
    ],
)
def test_bad_options_are_one_line_errors(run, tiny_llama, tmp_path, extra, message):
    result = run(tiny_llama, "--out", tmp_path / "q", *extra)
    assert result.exit_code == 1
    assert result.stderr.startswith(message) and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "q").exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--dtype", "int4"], "'int4' is not one of 'int8', 'fp8'"),
        (["--dtype", "int8", "--granularity", "group"], "'group' is not one of 'per-channel', 'per-tensor'"),
    ],
)
def test_bad_choices_are_usage_errors(run, tiny_llama, tmp_path, extra, message):
    """A value outside the choices is a usage error (exit 2), like a bad enum in every other command."""
    result = run(tiny_llama, "--out", tmp_path / "q", *extra)
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.replace("│", " ").split())
    assert not (tmp_path / "q").exists() and list(tmp_path.iterdir()) == []


def test_existing_output_and_quantized_input_are_refused(run, tiny_llama, tmp_path):
    out = tmp_path / "q"
    assert run(tiny_llama, "--out", out, "--dtype", "int8", "--quiet").exit_code == 0
    other = run(tiny_llama, "--out", out, "--dtype", "fp8")
    assert other.exit_code == 1 and "output already exists with different inputs or options" in other.stderr
    requant = run(out, "--out", tmp_path / "q2", "--dtype", "int8")
    assert requant.exit_code == 1 and "input is already quantized" in requant.stderr
    missing = run(tmp_path / "nope", "--out", tmp_path / "q3", "--dtype", "int8")
    assert missing.exit_code == 1 and missing.stderr.startswith("error: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q"]


def test_progress_plain_logs_each_stage_and_none_logs_nothing(run, tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("NEURONPACK_PROGRESS_INTERVAL", "0")  # a progress line at every step
    plain = run(tiny_llama, "--out", tmp_path / "a", "--dtype", "int8", "--progress", "plain", "--format", "json")
    assert plain.exit_code == 0, plain.output
    lines = [line for line in plain.stderr.splitlines() if "quantize int8 per-channel" in line]
    assert "started (" in lines[0] and "steps)" in lines[0] and "done in" in lines[-1]
    assert any("%)" in line and "elapsed" in line for line in lines[1:-1])
    assert json.loads(plain.stdout)["out"] == str(tmp_path / "a")
    none = run(tiny_llama, "--out", tmp_path / "b", "--dtype", "int8", "--progress", "none", "--format", "json")
    assert none.exit_code == 0 and "quantize int8 per-channel" not in none.stderr


def test_nonfinite_checkpoint_is_one_line_exit_1_and_leaves_nothing(run, tiny_llama, tmp_path):
    from tests.convert.test_quantize import poison

    bad = poison(tiny_llama, tmp_path / "bad", "model.layers.0.self_attn.k_proj.weight", (3, 9), float("nan"))
    out = tmp_path / "out" / "q"
    out.parent.mkdir()
    result = run(bad, "--out", out, "--dtype", "int8", "--quiet")
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: tensor model.layers.0.self_attn.k_proj.weight holds nan at index [3, 9]: int8/fp8 "
                     f"cannot represent it ({bad}). the checkpoint is corrupt (a diverged run or a bad conversion); "
                     "repair or re-export the weights"]
    assert "Traceback" not in result.output and list(out.parent.iterdir()) == []



def _moe_checkpoint(tiny_llama, out):
    """tiny_llama with its MLPs named as a Mixtral checkpoint names them on disk (block_sparse_moe.experts.E.w1/w2/w3,
    two experts): the longest Linear names of a model NxDI serves."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny_llama, out)
    tensors = load_file(out / "model.safetensors")
    expert_name = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
    for name in [n for n in tensors if ".mlp." in n]:
        layer, proj = name.removesuffix(".weight").split(".mlp.")
        weight = tensors.pop(name)
        for expert in range(2):
            tensors[f"{layer}.block_sparse_moe.experts.{expert}.{expert_name[proj]}.weight"] = weight.clone()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _table_rows(text: str) -> list[list[str]]:
    """The body rows of a rich table as cell texts, a label folded over several lines joined back."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if not cells:
            continue
        if rows and not any(cells[1:]):  # the rest of a folded label
            rows[-1][0] += cells[0]
        else:
            rows.append(cells)
    return rows


def test_at_80_columns_no_tensor_name_or_figure_is_cut(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    moe = _moe_checkpoint(tiny_llama, tmp_path / "moe")
    result = CliRunner().invoke(app, ["quantize", str(moe), "--out", str(tmp_path / "q"), "--dtype", "int8"])
    assert result.exit_code == 0, result.output
    assert "…" not in result.stderr  # rich cut "model.layers.1.block_sparse_moe.experts.0.w…" here
    assert max(len(line) for line in result.stderr.splitlines() if line[:1] in "┏┃┡│├└") <= 80
    report = json.loads((tmp_path / "q" / "quantization_report.json").read_text())
    shown = {row[0]: row[1:] for row in _table_rows(result.stderr)}
    for tensor in report["tensors"]:
        assert shown[tensor["name"]] == ["x".join(map(str, tensor["shape"])), f"{tensor['relative_error']:.5f}",
                                         f"{tensor['snr_db']:.1f}"]
