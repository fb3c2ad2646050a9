"""Which vLLM integration serves a Neuron artifact: picked from what is installed, or forced with --vllm-target.

Targets (each has its own module turning a LaunchSpec into argv + environment):

- ``vllm-v0``: vLLM mainline 0.9.x, V0 engine with its Neuron worker (vllm_v0.py, dialect "0.9");
- ``vllm-v0-fork``: the AWS Neuron fork aws-neuron/upstreaming-to-vllm 2.24.0 (vLLM 0.7.2 base, V0; the only
  V0 line with a released multi-node launcher) (vllm_v0.py, dialect "fork");
- ``vllm-neuron``: vllm-project/vllm-neuron, the V1 "classic" plugin on NxDI, 0.4.x (vLLM 0.13) / 0.5.x (vLLM 0.16)
  (vllm_plugin.py).

The SDK 2.31+ "vLLM Neuron" plugin (versions like 0.21.0.1.0.0, 0.24.0.1.1.0) implements models itself with its
own compile cache: it cannot load an NxDI artifact. Its artifacts are framework ``vneuron``, served by
backends/vneuron/launch.py; an nxd / tnx artifact on such a machine is refused with that fix.

Example::

    choose_target("auto", "nxd", {"vllm": "0.16.0", "vllm-neuron": "0.5.0"}).name   # "vllm-neuron"
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuronpack.artifacts.manifest import Manifest
from neuronpack.backends.neuron import support_matrix
from neuronpack.backends.neuron.common import version_tuple
from neuronpack.backends.neuron.support_matrix import is_new_plugin
from neuronpack.backends.vllm.launch import LaunchSpec, VllmCommand, launch_spec
from neuronpack.backends.vllm.structured import check_tool_call_parser, structured_plan
from neuronpack.errors import ServeError

TARGETS = ("vllm-v0", "vllm-v0-fork", "vllm-neuron")
TARGET_CHOICES = ("auto", *TARGETS)
NEW_PLUGIN_FIX = ("on this stack compile the model with `neuronpack compile --framework vneuron` (a vneuron "
                  "recipe) and serve that artifact; NxDI artifacts need the classic plugin (vllm-neuron 0.5.0, "
                  "vLLM 0.16) or vLLM V0: see docs/neuron.md 'Support matrix'")


@dataclass(frozen=True)
class TargetChoice:
    name: str  # one of TARGETS
    reason: str


def choose_target(requested: str, framework: str, installed: dict[str, str | None]) -> TargetChoice:
    """The serving target for an artifact of ``framework`` ("nxd" | "tnx") given installed versions.

    Example::

        choose_target("auto", "nxd", {}).name                        # "vllm-neuron" (nothing installed: print it)
        choose_target("auto", "nxd", {"vllm": "0.9.2"}).name         # "vllm-v0"
    """
    requested = (requested or "auto").strip().lower()
    if requested not in TARGET_CHOICES:
        raise ServeError(f"unknown vLLM target {requested!r}", where="--vllm-target",
                         fix=f"use one of {', '.join(TARGET_CHOICES)}")
    plugin = installed.get("vllm-neuron")
    if requested == "vllm-neuron" or (requested == "auto" and plugin):
        refuse_new_plugin(plugin)
    if framework == "tnx":
        if requested == "vllm-neuron":
            raise ServeError("the vllm-neuron plugin serves NxD Inference only, not transformers-neuronx",
                             where="--vllm-target", fix="use --vllm-target vllm-v0 (vLLM 0.9) for a tnx artifact")
        if requested != "auto":
            return TargetChoice(requested, f"requested {requested}")
        return _v0_from(installed, "transformers-neuronx runs only on vLLM V0")
    if requested != "auto":
        return TargetChoice(requested, f"requested {requested}")
    if plugin:
        return TargetChoice("vllm-neuron", f"vllm-neuron {plugin} is installed (vLLM {installed.get('vllm')}, V1)")
    if installed.get("vllm"):
        return _v0_from(installed, "no vllm-neuron plugin installed")
    return TargetChoice("vllm-neuron", "no vLLM here: printing for the vllm-neuron plugin (V1, where Neuron users "
                                       "are); --vllm-target vllm-v0 for V0")


def refuse_new_plugin(plugin_version: str | None) -> None:
    """ServeError when an nxd / tnx artifact would go to the SDK 2.31+ plugin (it cannot load NxDI)."""
    if is_new_plugin(plugin_version):
        raise ServeError(
            f"vllm-neuron {plugin_version} is the SDK 2.31+ 'vLLM Neuron' plugin: it implements models itself with its "
            "own compile cache and cannot load NxD Inference artifacts", where="vllm-neuron", fix=NEW_PLUGIN_FIX)


def _v0_from(installed: dict[str, str | None], why: str) -> TargetChoice:
    vllm = installed.get("vllm")
    version = version_tuple(vllm)
    if not vllm:
        return TargetChoice("vllm-v0", f"{why}; no vLLM here: printing for vLLM 0.9 (V0)")
    if version[:2] in ((0, 7), (0, 8)):
        return TargetChoice("vllm-v0-fork", f"vLLM {vllm} (the AWS Neuron fork line, V0); {why}")
    if version[:2] == (0, 9):
        return TargetChoice("vllm-v0", f"vLLM {vllm} (V0); {why}")
    raise ServeError(f"vLLM {vllm} has no Neuron V0 engine and the vllm-neuron plugin is not installed",
                     where="vllm", fix="install vllm-neuron 0.5.0 (it brings vLLM 0.16) or vLLM 0.9.x; see "
                                        "docs/neuron.md 'Support matrix'")


def vllm_command(artifact_dir: Path, manifest: Manifest | dict[str, Any], *, target: str = "vllm-v0",
                 host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
                 python: str = sys.executable, tool_call_parser: str | None = None,
                 structured_outputs: bool = False, vllm_version: str | None = None) -> VllmCommand:
    """The launch of a compiled nxd or tnx artifact for one serving target: ``spec_command`` on the artifact's
    ``launch_spec``.

    Example::

        vllm_command(Path("art"), manifest, target="vllm-neuron").env["NEURON_COMPILED_ARTIFACTS"]   # "/abs/art"
    """
    return spec_command(launch_spec(artifact_dir, manifest), target=target, host=host, port=port, api_key=api_key,
                        python=python, tool_call_parser=tool_call_parser, structured_outputs=structured_outputs,
                        vllm_version=vllm_version)


def spec_command(spec: LaunchSpec, *, target: str = "vllm-v0", host: str = "127.0.0.1", port: int = 8000,
                 api_key: str | None = None, python: str = sys.executable, tool_call_parser: str | None = None,
                 structured_outputs: bool = False, vllm_version: str | None = None) -> VllmCommand:
    """The launch of an artifact's ``LaunchSpec`` for one serving target (vllm_v0 / vllm_plugin build it).
    ``tool_call_parser``: vLLM's ``--enable-auto-tool-choice --tool-call-parser NAME`` (what ``tool_choice: "auto"``
    needs there), checked against the names the target's vLLM registers (``vllm_version``: the installed one).
    ``structured_outputs``: refuse (ServeError) where the target cannot enforce grammars on this artifact; without
    it that is a note (vllm_structured.py says why)."""
    from neuronpack.backends.vllm import plugin as vllm_plugin
    from neuronpack.backends.vllm import v0 as vllm_v0

    if target == "vllm-neuron":
        cmd = vllm_plugin.plugin_command(spec, host=host, port=port, api_key=api_key, python=python)
    elif target in ("vllm-v0", "vllm-v0-fork"):
        dialect = "fork" if target == "vllm-v0-fork" else "0.9"
        cmd = vllm_v0.v0_command(spec, dialect=dialect, host=host, port=port, api_key=api_key, python=python)
    else:
        raise ServeError(f"unknown vLLM target {target!r}", where="--vllm-target",
                         fix=f"use one of {', '.join(TARGETS)}")
    argv, env, notes = cmd.argv, dict(cmd.env), list(cmd.notes)
    if cmd.launched_elsewhere and (tool_call_parser or structured_outputs):
        flag = "--tool-call-parser" if tool_call_parser else "--structured-outputs"
        raise ServeError("the multi-node launcher starts vllm.entrypoints.api_server, which has no tool calling and "
                         "no response_format", where=flag, fix=f"serve without {flag}")
    if tool_call_parser:
        note = check_tool_call_parser(tool_call_parser, target, vllm_version=vllm_version)
        notes += [note] if note else []
        argv = [*argv, "--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
    if not cmd.launched_elsewhere:
        plan = structured_plan(spec, target, requested=structured_outputs)
        env.update(plan.env)
        notes += plan.notes
    problem = build_pairing_problem(spec, target)
    if problem is not None:
        notes.append(problem)
    return VllmCommand(argv, env, cmd.cwd, notes, cmd.target, cmd.launched_elsewhere)


def build_pairing_problem(spec: LaunchSpec, target: str) -> str | None:
    """A sentence when the artifact's build versions (NxDI / compiler / torch-neuronx) pair with no declared
    stack of ``target`` (None for tnx, whose builds vLLM recompiles anyway)."""
    if spec.framework != "nxd":
        return None
    built = {k: v for k, v in spec.versions.items() if k in support_matrix.BUILD_DISTS and v and v != "absent"}
    if "neuronx-distributed-inference" not in built or support_matrix.pairings_for_build(built, _family(target)):
        return None
    return (f"this artifact was built with {support_matrix.describe(built)}, which pairs with no {target} stack in "
            "docs/neuron.md's support matrix: serving it there is refused")


def check_serving_stack(spec: LaunchSpec, target: str, installed: dict[str, str | None]) -> str:
    """Before vLLM starts: the installed stack must be a declared pairing of ``target`` and the artifact's build must
    pair with it. Returns the pairing's name; ServeError (what, where, fix) otherwise."""
    if not installed.get("vllm"):
        raise ServeError("vllm is not installed in this Python", where=sys.executable,
                         fix="install one of the pairings in docs/neuron.md 'Support matrix' on the Neuron machine, or "
                             "print the command with --print-command")
    refuse_new_plugin(installed.get("vllm-neuron") if target == "vllm-neuron" else None)
    pairing = support_matrix.pairing_of(installed, target=_family(target))
    if pairing is None:
        raise ServeError(
            f"this machine's serving stack ({support_matrix.describe(installed)}) is not a {target} pairing "
            "neuronpack targets", where="installed packages",
            fix="install one of the pairings in docs/neuron.md 'Support matrix' (`neuronpack doctor` shows yours)")
    built = {k: v for k, v in spec.versions.items() if k in support_matrix.BUILD_DISTS and v and v != "absent"}
    if spec.framework == "nxd" and not pairing.matches(built, support_matrix.BUILD_DISTS, missing_ok=True):
        raise ServeError(
            f"this artifact was built with {support_matrix.describe(built)}, not with this machine's pairing "
            f"{pairing.name} (Neuron SDK {pairing.sdk})", where=str(spec.artifact_dir),
            fix=f"rebuild the artifact on this machine's SDK ({pairing.sdk}) or serve it where its pairing "
                "is installed")
    return pairing.name


def _family(target: str) -> str:
    return "vllm-v0" if target.startswith("vllm-v0") else target
