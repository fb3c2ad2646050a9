"""How tests/docs/doc_examples.py reads a page: console blocks, and what counts as the output the page shows."""

from __future__ import annotations

from tests.docs.doc_examples import (
    compare_figures,
    compare_keys,
    compare_text,
    normalise,
    split_console,
    unclosed_quote,
)


def test_console_blocks_split_into_commands_and_their_output():
    block = "$ neuronpack compile ./m \\\n      --quiet\n/a/b\n$ echo $?\n0\n"
    assert split_console(block) == [("neuronpack compile ./m \\\n      --quiet", ["/a/b"]), ("echo $?", ["0"])]
    # an open quote continues the command, as in bash (a JSON body over two lines hung the page's shell)
    block = "$ curl -d '{\"a\": 1,\n    \"b\": 2}' | jq .a\n1\n$ echo \"it's\"  # the reader's shell\nit's\n"
    assert split_console(block) == [("curl -d '{\"a\": 1,\n    \"b\": 2}' | jq .a", ["1"]),
                                    ("echo \"it's\"  # the reader's shell", ["it's"])]
    assert unclosed_quote("python -c 'print(\"word \" * 3)'") is False


def test_keys_times_and_paths_are_normalised_figures_are_not_ignored():
    assert normalise("cache hit: d99d274abc7b0b9b (built 2026-11-30T06:57:12Z)") == \
        normalise("cache hit: 2b226800f832fff2 (built 2026-12-05T22:00:02Z)")
    assert normalise("/tmp/e2e/neuron-compiled-artifacts/abc1234567") == normalise("/home/me/x/y/2b22680abc")
    assert compare_text(["framework: torch (requested torch explicitly)"], "framework: nxd (auto)\n") is not None
    assert compare_text(["PASS (float32 thresholds: ...)"], "x\nPASS (float32 thresholds: min_top1=1.0)\n") is None
    assert compare_text(["b", "a"], "a\nb\n") is not None  # in order


def test_a_json_object_is_compared_by_its_keys_at_every_depth_shown():
    assert compare_keys({"a": 1, "b": {"c": 2}}, {"a": 5, "b": {"c": 9}}) is None
    assert "pushed" in compare_keys({"a": 1}, {"a": 1, "pushed": None})
    assert "name" in compare_keys({"framework": {"name": 1, "reason": 2}},
                                  {"framework": {"auto": "torch", "effective": {"name": 1, "reason": 2}}})


def test_the_shell_keeps_output_without_a_final_newline_and_the_exit_code(tmp_path):
    from tests.docs.doc_examples import Workspace

    workspace = Workspace(cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    try:
        assert workspace.run("printf abc", "p") == (0, "abc")
        assert workspace.run("echo x; false", "p") == (1, "x\n")
        assert workspace.run("echo $?", "p") == (0, "1\n")
        assert workspace.run("X=5", "p") == (0, "") and workspace.run("echo $X", "p") == (0, "5\n")
    finally:
        workspace.close()


def test_a_figure_printed_unrounded_is_a_finding():
    """generate's JSON printed speculation.tokens_per_step as 2.6666666666666665 (docs/speculation.md: 2.6667)."""
    shown = {"speculation": {"tokens_per_step": 2.6667, "steps": 9}, "timings": {"load_s": 8.7034}}
    rounded = {"speculation": {"tokens_per_step": 2.5, "steps": 10}, "timings": {"load_s": 1.0}}
    assert compare_figures(shown, rounded) is None
    problem = compare_figures(shown, {"speculation": {"tokens_per_step": 2.6666666666666665, "steps": 9},
                                      "timings": {"load_s": 8.7034}})
    assert problem and ".speculation.tokens_per_step" in problem
    # a page that shows a value at full precision (an API's logprob) expects one
    assert compare_figures({"x": [-0.3376065194606781]}, {"x": [-0.33760619163513184]}) is None
    assert compare_figures({"x": 1e-05}, {"x": 3.2e-07}) is None  # exponent notation is not counted


def test_closing_the_workspace_ends_what_a_page_left_running(tmp_path):
    """A server a page started in the background and did not stop (a failed step) ends with the session."""
    import os

    import pytest

    from tests.docs.doc_examples import Workspace

    workspace = Workspace(cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    workspace.run("sleep 600 > /dev/null 2>&1 & echo $! > job.pid", "p")
    with pytest.raises(TimeoutError):
        workspace.run("sleep 600", "q", timeout=1)  # a hung step
    groups = [shell.pid for shell in workspace.shells.values()]
    workspace.close()
    for pid in [int((tmp_path / "job.pid").read_text()), *groups]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    for group in groups:
        with pytest.raises(ProcessLookupError):
            os.killpg(group, 0)


def test_an_output_block_after_a_python_example_is_what_it_prints(tmp_path):
    """serve.md shows what its client examples print in an output-only console block after each."""
    import pytest

    from tests.docs.doc_examples import page_examples

    def run(shown: str) -> None:
        page = tmp_path / "page.md"
        page.write_text(f'```python\nprint("Paris | stop", 2 + 6)\n```\n\nIt prints:\n\n```console\n{shown}\n```\n')
        for example in page_examples(page):
            example.namespace["workspace"] = None
            example.evaluate()

    run("Paris | stop 8")
    with pytest.raises(AssertionError, match="Lyon"):
        run("Lyon | stop 8")
