"""What `neuronpack doctor` reports: toolchain, Neuron packages, the framework auto picks, the serving pairing.

It lives apart from neuron_packages.py (the probes) so that select.py, nxd.py and tnx.py can use the probes without
an import cycle through the report.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from neuronpack.backends.neuron import support_matrix
from neuronpack.backends.neuron.packages import (
    dist_version,
    instance_type,
    neuron_devices,
    probe_all,
    python_info,
    relevant_env,
)
from neuronpack.backends.nxd.families import family_report
from neuronpack.backends.select import ENV_FRAMEWORK, ENV_VLLM_FRAMEWORK, auto_framework, choose_framework
from neuronpack.backends.torch_aot.target import cxx_compiler
from neuronpack.backends.vneuron.variables import POD_VARIABLES

VALIDATED = (
    "recipe -> NxDI NeuronConfig / TNx from_pretrained mapping, for every shipped recipe (contract tests)",
    "the compile call sequence and artifact layout, against a stand-in SDK with the real module and class names",
    "toolchain versions recorded in the manifest and checked before serving",
    "the launch line of each serving target (vLLM 0.9 V0, the AWS fork 2.24.0, vllm-neuron 0.4.1 / 0.5.0) against "
    "a stand-in; `make upstream-check` runs upstream's own parsers and config classes on them",
    "vneuron (vllm-neuron 0.21): the packaged compile cache against the plugin's own 0.21 cache code (entries written "
    "by its _store_local, loadable by its _build_cache_artifact, local hits for its compile() with the environment "
    "serve sets, a device start through its parallel_compile), with a stand-in for the CPU compile and the worker",
)
NOT_VALIDATED = (
    "not run on hardware: no Neuron compile or load has run from this code; the nxd and tnx backends are written "
    "against upstream source (NxDI 0.9, transformers-neuronx 0.13, vLLM 0.9 / 0.13 / 0.16, vllm-neuron 0.4.1 / 0.5.0)",
    "vLLM itself serving a neuronpack artifact on Trainium/Inferentia",
    "vneuron: no real vllm-neuron, vLLM 0.21 / 0.24, neuronx-cc or Trn2 ran; 0.24's cache library "
    "(libtorch-neuronx-lite) was read from its docs only; NEURON_LIBTORCH_ASSERT_CACHE_HIT is named by no AWS page and "
    "is not relied on (the pod checks its guards with the installed plugin and watches its cache root instead)",
)


def serving_path(pairing: support_matrix.Pairing | None, plugin_version: str | None) -> str:
    """Which artifacts this machine serves, in one sentence (doctor)."""
    if pairing is not None and pairing.refused:
        return f"none: {pairing.refused}"
    if pairing is not None and pairing.target == "vneuron":
        return "the SDK 2.31+ vLLM Neuron plugin: compile with --framework vneuron (a vneuron recipe)"
    if pairing is not None:
        return f"NxD Inference artifacts (--framework nxd) through {pairing.target}"
    if support_matrix.is_new_plugin(plugin_version):
        return "the SDK 2.31+ vLLM Neuron plugin, at versions neuronpack does not declare"
    return "the portable runtime (torch artifacts); Neuron artifacts only print their vLLM command here"


def serving_report(installed: dict[str, str | None] | None = None) -> dict:
    """The installed serving stack, the declared pairing it is (or None), and every declared pairing."""
    installed = support_matrix.installed_versions() if installed is None else installed
    pairing = support_matrix.pairing_of(installed)
    return {"installed": installed, "pairing": None if pairing is None else pairing.name,
            "refused": bool(pairing and pairing.refused), "path": serving_path(pairing, installed.get("vllm-neuron")),
            "supported": [p.to_dict() for p in support_matrix.PAIRINGS]}


def environment_report(environ: Mapping[str, str] | None = None) -> dict:
    """Everything `neuronpack doctor` shows, as one JSON-able dict (it reports; it never raises for a missing SDK).

    Example::

        environment_report()["framework"]   # {"auto": "torch", "reason": "auto: no Neuron framework here (...)"}
    """
    from neuronpack import __version__

    environ = os.environ if environ is None else environ
    auto = auto_framework()
    try:
        effective = choose_framework("auto", environ)
        effective_dict = {"name": effective.name, "reason": effective.reason}
    except Exception as exc:  # noqa: BLE001 - a bad env value is reported here, raised by compile
        effective_dict = {"name": None, "reason": str(exc)}
    return {
        "neuronpack": __version__,
        "python": python_info(),
        "torch": dist_version("torch"),
        "transformers": dist_version("transformers"),
        "cxx": cxx_compiler() or {"path": None, "version": None},
        "packages": [status.to_dict() for status in probe_all()],
        "neuronx_cc": dist_version("neuronx-cc"),
        "platform": {
            "instance_type": instance_type(),
            "neuron_devices": neuron_devices(),
            "platform_target_override": environ.get("NEURON_PLATFORM_TARGET_OVERRIDE"),
        },
        "framework": {"auto": auto.name, "auto_reason": auto.reason, "effective": effective_dict,
                      "env_names": [ENV_FRAMEWORK, ENV_VLLM_FRAMEWORK]},
        "serving": serving_report(),
        "nxd_families": family_report(),
        "vneuron_variables": [v.to_dict() for v in POD_VARIABLES],
        "env": relevant_env(environ),
        "validated": list(VALIDATED),
        "not_validated": list(NOT_VALIDATED),
    }
