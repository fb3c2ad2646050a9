"""compile / inspect / verify / ls / gc through the CLI, as a CI pipeline would drive them."""

import json
from pathlib import Path

from typer.testing import CliRunner

from neuronpack.cli.app import app

RECIPE = str(Path(__file__).parents[2] / "recipes" / "tiny-test.toml")
runner = CliRunner(env={"COLUMNS": "120"})


def test_compile_json_then_cache_hit_then_tools(tiny_llama, tmp_path):
    args = ["compile", str(tiny_llama), "--recipe", RECIPE, "--set", "compiler=export", "--out-root", str(tmp_path)]
    first = runner.invoke(app, [*args, "--format", "json"])
    assert first.exit_code == 0, first.output
    built = json.loads(first.stdout)
    assert built["cache_hit"] is False and built["framework"] == "torch"
    assert Path(built["path"]).is_dir() and built["files"] > 3

    hit = json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)
    assert hit["cache_hit"] and all(round(v, 3) == v for v in hit["timings"].values())  # no 0.006850106999991112
    second = runner.invoke(app, args)
    assert second.exit_code == 0
    assert second.stdout.strip().splitlines()[-1] == built["path"]
    assert "cache hit" in second.stderr

    listed = runner.invoke(app, ["ls", "--root", str(tmp_path), "--format", "json"])
    assert [a["key"] for a in json.loads(listed.stdout)["artifacts"]] == [built["key"]]
    table = runner.invoke(app, ["ls", "--root", str(tmp_path)])
    assert built["key"][:16] in table.stdout

    shown = runner.invoke(app, ["inspect", built["path"]])
    assert shown.exit_code == 0 and "16, 64" in shown.stdout and "64, 128" in shown.stdout
    assert "None" not in shown.stdout  # no Python reprs: "quantization  none"
    narrow = CliRunner(env={"COLUMNS": "80"})
    for command in (["inspect", built["path"]], ["ls", "--root", str(tmp_path)]):
        # at 80 columns a key or figure folds or a label wraps; nothing is cut to "…"
        assert "…" not in narrow.invoke(app, command).stdout
    # into a pipe or log (COLUMNS unset, not a terminal) tables print at their natural width: the key on one line
    piped = CliRunner(env={"COLUMNS": None}).invoke(app, ["inspect", built["path"]])
    assert any(built["key"] in line for line in piped.stdout.splitlines())
    # one size format: ls and gc say the same size the same way
    size = json.loads(listed.stdout)["artifacts"][0]["size"]
    from neuronpack.cli._progress import human_bytes

    dry_text = runner.invoke(app, ["gc", "--root", str(tmp_path), "--keep", "0", "--dry-run"])
    assert human_bytes(size) in table.stdout and human_bytes(size) in dry_text.stdout

    ok = runner.invoke(app, ["verify", built["path"], "--format", "json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["ok"] is True

    (Path(built["path"]) / "config.json").write_text("{}")
    bad = runner.invoke(app, ["verify", built["path"]])
    assert bad.exit_code == 1
    assert "error: file config.json has" in bad.stderr and "Traceback" not in bad.output

    dry = runner.invoke(app, ["gc", "--root", str(tmp_path), "--keep", "0", "--dry-run", "--format", "json"])
    assert json.loads(dry.stdout)["dry_run"] is True
    assert Path(built["path"]).exists()
    real = runner.invoke(app, ["gc", "--root", str(tmp_path), "--keep", "0"])
    assert real.exit_code == 0 and not Path(built["path"]).exists()


def test_compile_dry_run_json(tiny_llama, tmp_path):
    result = runner.invoke(app, ["compile", str(tiny_llama), "--recipe", RECIPE, "--out-root", str(tmp_path),
                                 "--dry-run", "--format", "json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["dry_run"] is True and payload["framework"] == "torch" and len(payload["key"]) == 64
    assert not Path(payload["path"]).exists()


def test_compile_bad_inputs_are_one_line_errors(tmp_path):
    missing = runner.invoke(app, ["compile", str(tmp_path / "nope"), "--recipe", RECIPE, "--out-root", str(tmp_path)])
    assert missing.exit_code == 1 and missing.stderr.count("\n") == 1 and "Traceback" not in missing.output
    bad_set = runner.invoke(app, ["compile", "x", "--recipe", RECIPE, "--set", "target.batch_size=-1"])
    assert bad_set.exit_code == 1 and "target.batch_size" in bad_set.stderr
    no_model = runner.invoke(app, ["compile", "--recipe", RECIPE])
    assert no_model.exit_code == 1 and "no model to compile" in no_model.stderr


def test_error_text_keeps_square_brackets(tiny_llama, tmp_path):
    """Error lines are printed with rich markup escaped: "[speculation]" must survive."""
    result = runner.invoke(app, ["compile", str(tiny_llama), "--recipe", RECIPE, "--root", str(tmp_path),
                                 "--set", f'speculation.draft="{tiny_llama}"', "--set", 'speculation.kind="draft"',
                                 "--dry-run"])
    assert result.exit_code == 1
    assert "set [speculation] kind" in result.stderr


def test_usage_errors_exit_2(tmp_path):
    for args in (["compile", "x", "--recipe", RECIPE, "--set", "no-equals-sign"],
                 ["gc", "--root", str(tmp_path), "--older-than", "soon"],
                 ["buckets", "--seq-len", "128", "--context", "64,abc"],
                 ["doctor", "--format", "yaml"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output
