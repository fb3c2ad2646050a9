"""How tests/docs/doc_examples.py reads a page: console blocks, and what counts as the output the page shows."""

from __future__ import annotations

from tests.docs.doc_examples import compare_keys, compare_text, normalise, split_console


def test_console_blocks_split_into_commands_and_their_output():
    block = "$ neuronpack compile ./m \\\n      --quiet\n/a/b\n$ echo $?\n0\n"
    assert split_console(block) == [("neuronpack compile ./m \\\n      --quiet", ["/a/b"]), ("echo $?", ["0"])]


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
