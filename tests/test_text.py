"""Control characters in what goes into a recipe or a manifest: refused by ``--set`` (typed or as a TOML escape), by
the recipe loader (a file, MODEL) and by every CLI option whose value is stored (a usage error, exit 2); plain text
of any script still round-trips."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from typer.testing import CliRunner

from neuronpack.cli.app import app
from neuronpack.errors import RecipeError
from neuronpack.recipe import load_recipe, parse_set
from neuronpack.text import control_character
from tests.fuzz import assert_one_line, fuzz_settings

REFUSED = ("Cc", "Zl", "Zp")
plain = st.text(st.characters(blacklist_categories=(*REFUSED, "Cs")), max_size=20)
controls = st.characters(whitelist_categories=REFUSED)


def toml_string(text: str) -> str:
    """A TOML basic string holding ``text``: quotes and backslashes escaped, control characters as \\uXXXX."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if control_character(c) is None else f"\\u{ord(c):04x}" for c in escaped) + '"'


@fuzz_settings(300)
@given(text=plain)
def test_plain_text_round_trips_through_set(text):
    assert control_character(text) is None
    assert parse_set(f"name={toml_string(text)}") == (["name"], text)


@fuzz_settings(300)
@given(before=plain, char=controls, after=plain)
@example(before='"a"', char="\n", after="b=1")  # was read as name="a" (the rest dropped), exit 0
@example(before="x", char="\r", after="")
def test_a_control_character_is_refused_typed_or_escaped(before, char, after):
    assert control_character(before + char + after) == (len(before), char)
    for assignment in (f"name={before}{char}{after}", f"name={toml_string(before + char + after)}",
                       f'labels.team=["ok", {toml_string(before + char + after)}]'):
        with pytest.raises(RecipeError) as err:
            parse_set(assignment)
        assert_one_line(err.value)
        assert repr(char) in err.value.what and err.value.where == "--set"


@fuzz_settings(100)
@given(before=plain, char=controls, after=plain)
def test_recipe_files_and_model_refuse_control_characters(tmp_path_factory, before, char, after):
    bad = before + char + after
    path = tmp_path_factory.mktemp("r") / "r.toml"
    path.write_text(f"description = {toml_string(bad)}\n")
    with pytest.raises(RecipeError, match=r"^description holds a control character"):
        load_recipe(path)
    with pytest.raises(RecipeError, match=r"^model\.source holds a control character"):
        load_recipe(model=bad)


@pytest.mark.parametrize("argv", [
    ["compile", "--set", 'name="a"\nb=1', "--dry-run"],
    ["compile", "--set", 'name="a\\u001b[2Jb"', "--dry-run"],
    ["compile", "./model\n", "--dry-run"],
    ["serve", "artifact", "--served-model-name", "tiny\x1b[31m"],
    ["serve", "artifact", "--model", "org/m\r"],
    ["quantize", "model\n", "--out", "q", "--dtype", "int8"],
    ["quantize", "model", "--out", "q", "--dtype", "int8", "--skip", "layers.0.*\nlayers.1.*"],
    ["convert-eagle", "--draft", "d\x00", "--target", "t", "--out", "o"],
    ["convert-eagle", "--draft", "d", "--target", "t\u2028", "--out", "o"],
])
def test_options_stored_in_a_recipe_or_manifest_refuse_control_characters(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert "control character" in result.stderr and "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []
