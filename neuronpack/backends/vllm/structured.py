"""Structured outputs and tool calling on the vLLM serving targets: what each one's own code does with them.

Read from upstream (file paths and commits in docs/serve.md, "Structured outputs and tool calls on Neuron"):

- Tool calling is vLLM's OpenAI server: ``--enable-auto-tool-choice --tool-call-parser NAME``. The parser accepts any
  string; the server refuses a name its ToolParserManager does not register when it starts
  (``validate_api_server_args`` in vllm/entrypoints/openai/api_server.py: "invalid tool call parser"). The names are
  per vLLM version (TOOL_CALL_PARSERS), so neuronpack checks them before it hands over.
- Structured outputs (response_format, guided_* / structured_outputs, and the tool_choice "required" / named that
  vLLM enforces with them) are applied to host-side logits only:
  vllm-neuron 0.4.1 / 0.5.0 (``NeuronxDistributedModelRunner.sample_tokens``) applies the grammar bitmask on its CPU
  sampling path and, when the loaded neuron_config has ``on_device_sampling_config``, logs "The grammar bitmask will
  be ignored" and samples unconstrained; vLLM V0's Neuron runner (0.9.2 and the 2.24.0 fork,
  ``NeuronModelRunner._sample`` / ``execute_model``) calls ``compute_logits``, the only place the guided-decoding
  logits processors run, only with ``NEURON_ON_DEVICE_SAMPLING_DISABLED=1``.
  So an nxd artifact compiled with on-device sampling can never enforce them; one compiled with host sampling
  (``sampling.on_device = false``) can, and V0 then needs that variable (the fork's model has no host sampler
  without it). vLLM compiles TNx itself at start-up, with on-device generation unless the variable is set.

No backend flag is passed: the defaults are the real ones (fork 0.7.2 ``--guided-decoding-backend xgrammar``,
0.9.2 ``auto``, 0.13 / 0.16 ``--structured-outputs-config`` backend ``auto``; 0.13+ has no
``--guided-decoding-backend``).

Example::

    check_tool_call_parser("hermes", "vllm-neuron", vllm_version="0.16.0")   # None (registered there)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from neuronpack.backends.neuron.common import version_tuple
from neuronpack.backends.vllm.launch import LaunchSpec
from neuronpack.errors import ServeError

HOST_SAMPLING_ENV = "NEURON_ON_DEVICE_SAMPLING_DISABLED"
# ToolParserManager's registered names per vLLM version (the fork's 0.7.2 base and 0.9.2: the register_module
# decorators under vllm/entrypoints/openai/tool_parsers/; 0.13.0 / 0.16.0: _TOOL_PARSERS_TO_REGISTER in
# vllm/tool_parsers/__init__.py)
_V0_9 = ("deepseek_v3", "granite", "granite-20b-fc", "hermes", "internlm", "jamba", "llama3_json", "llama4_json",
         "llama4_pythonic", "minimax", "mistral", "phi4_mini_json", "pythonic", "xlam")
_V0_13 = (*_V0_9, "deepseek_v31", "deepseek_v32", "ernie45", "gigachat3", "glm45", "hunyuan_a13b", "kimi_k2",
          "longcat", "minimax_m2", "olmo3", "openai", "qwen3_coder", "qwen3_xml", "seed_oss", "step3")
TOOL_CALL_PARSERS: dict[str, tuple[str, ...]] = {
    "0.7.2": ("granite", "granite-20b-fc", "hermes", "internlm", "jamba", "llama3_json", "mistral", "pythonic"),
    "0.9.2": _V0_9,
    "0.13.0": _V0_13,
    "0.16.0": (*_V0_13, "functiongemma", "glm47", "step3p5"),
}
TARGET_VLLM = {"vllm-v0": ("0.9.2",), "vllm-v0-fork": ("0.7.2",), "vllm-neuron": ("0.13.0", "0.16.0")}
REBUILD_FIX = ("rebuild it with host sampling (`neuronpack compile ... --set sampling.on_device=false`: slower "
               "decode) or serve without --structured-outputs")
NOT_ENFORCED = ("structured outputs are NOT enforced on this artifact (response_format, guided_* / "
                "structured_outputs, tool_choice required or named: vLLM returns unconstrained text)")


@dataclass(frozen=True)
class StructuredPlan:
    """What a launch adds for structured outputs: environment, and notes to print once."""

    env: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def check_tool_call_parser(name: str, target: str, *, vllm_version: str | None = None) -> str | None:
    """ServeError (naming the choices) when no vLLM version of ``target`` registers ``name``; a note when only some
    do. ``vllm_version``: the installed vLLM, when it is one of the target's (then only its names count)."""
    versions = _versions(target, vllm_version)
    known = [v for v in versions if name in TOOL_CALL_PARSERS[v]]
    if not known:
        choices = sorted({n for v in versions for n in TOOL_CALL_PARSERS[v]})
        raise ServeError(f"vLLM {' / '.join(versions)} ({target}) registers no tool call parser {name!r}",
                         where="--tool-call-parser", fix=f"use one of: {', '.join(choices)}")
    if len(known) < len(versions):
        return (f"tool call parser {name!r} is registered by vLLM {' / '.join(known)} only, not by the others of "
                f"{target}")
    return None


def structured_plan(spec: LaunchSpec, target: str, *, requested: bool) -> StructuredPlan:
    """The environment and notes for structured outputs on ``target``. ``requested`` (serve --structured-outputs):
    ServeError where the target cannot enforce them on this artifact, instead of a note."""
    v0 = target.startswith("vllm-v0")
    if spec.framework == "tnx":  # vLLM compiles TNx itself: host sampling is the variable's choice, not the artifact's
        if requested or not spec.on_device_sampling:
            return StructuredPlan({HOST_SAMPLING_ENV: "1"})
        return StructuredPlan(notes=(f"{NOT_ENFORCED} because vLLM compiles transformers-neuronx with on-device "
                                     "generation; serve with --structured-outputs to have it sample on the host",))
    if spec.on_device_sampling:
        why = ("the artifact samples on device (neuron_config.on_device_sampling_config) and "
               + ("vLLM V0's Neuron runner runs guided-decoding logits processors only on host logits" if v0
                  else "vllm-neuron's runner then ignores the grammar bitmask (it logs a warning)"))
        if requested:
            raise ServeError(f"{why}, so --structured-outputs cannot be honoured", where=str(spec.artifact_dir),
                             fix=REBUILD_FIX)
        return StructuredPlan(notes=(f"{NOT_ENFORCED} because {why}",))
    # host sampling compiled in: V0 needs the variable to compute logits (and apply the processors) on the host
    return StructuredPlan({HOST_SAMPLING_ENV: "1"} if v0 else {})


def _versions(target: str, vllm_version: str | None) -> tuple[str, ...]:
    versions = TARGET_VLLM[target]
    if vllm_version:
        same = [v for v in versions if version_tuple(v)[:2] == version_tuple(vllm_version)[:2]]
        if same:
            return tuple(same)
    return versions
