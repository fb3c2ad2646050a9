"""docs/neuron.md's Kubernetes example for the SDK 2.31+ plugin: its commands are parsed by neuronpack's own CLI
(click, as the `neuronpack` entry point parses them), so a renamed or dropped option breaks this test, not a pod."""

from __future__ import annotations

import re
from pathlib import Path

import click
import typer.main
import yaml

from neuronpack.cli.app import app

DOC = Path(__file__).resolve().parents[3] / "docs" / "neuron.md"


def _pod() -> dict:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    pods = [yaml.safe_load(block) for block in blocks if "kind: Pod" in block]
    assert len(pods) == 1, "docs/neuron.md should hold one Kubernetes Pod example"
    return pods[0]


def _parse(argv: list[str]) -> click.Context:
    assert argv[0] == "neuronpack"
    group = typer.main.get_command(app)
    name, *rest = argv[1:]
    command = group.get_command(click.Context(group), name)
    assert command is not None, f"neuronpack has no command {name!r}"
    return command.make_context(f"neuronpack {name}", list(rest))  # raises on an unknown option or a bad value


def test_the_pods_commands_parse_against_the_cli():
    pod = _pod()["spec"]
    [pull] = pod["initContainers"]
    [server] = pod["containers"]
    pulled = _parse(pull["command"]).params
    served = _parse(server["command"]).params
    assert pulled["remote"].startswith("s3://")
    # the server serves exactly what the init container pulled, from the volume both mount
    root = Path(pulled["root"])
    assert Path(served["artifact_dir"]) == root / "neuron-compiled-artifacts" / pulled["key"]
    mounts = {m["name"]: m["mountPath"] for m in server["volumeMounts"]}
    assert Path(served["artifact_dir"]).is_relative_to(mounts["artifacts"])
    assert Path(served["weights"]).is_relative_to(mounts["models"])
    assert served["host"] == "0.0.0.0" and server["ports"][0]["containerPort"] == served["port"]
    assert "aws.amazon.com/neuron" in server["resources"]["limits"]
