"""Which framework builds (nxd, tnx or torch) and why, and the backend registry.

Precedence, highest first:

1. ``requested`` when it is not "auto" (the pipeline passes ``--framework`` if given, else the recipe's
   ``target.framework``): an explicit choice always wins over the environment;
2. ``NEURONPACK_FRAMEWORK`` (nxd | tnx | torch);
3. ``VLLM_NEURON_FRAMEWORK`` (``neuronx-distributed-inference`` | ``transformers-neuronx``), vLLM's own variable, so
   a machine configured for vLLM builds what vLLM will load;
4. auto: vneuron when the SDK 2.31+ vLLM Neuron plugin (vllm-neuron 0.21 / 0.24) is installed (it is the only
   vLLM there: NxDI artifacts could not be served), else nxd if ``neuronx_distributed_inference`` imports, else tnx
   if ``transformers_neuronx`` imports, else torch (vLLM's own order). A PyPI placeholder counts as absent, and the
   reason names it.

A forced framework whose SDK is absent is still chosen: ``backend.availability()`` says why it cannot build, compile
refuses with that reason, and ``--dry-run`` still prints the configuration (it needs no SDK).

Example::

    choose_framework("auto", environ={})
    # FrameworkChoice(name="torch", reason="auto: neuronx-distributed-inference is not installed; ...")
    get_backend("nxd").compile_config(request)["neuron_config"]["tp_degree"]
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from neuronpack.backends.base import Backend
from neuronpack.backends.neuron.common import VLLM_FRAMEWORK_NAMES
from neuronpack.backends.neuron.packages import probe_package
from neuronpack.backends.neuron.support_matrix import is_new_plugin
from neuronpack.errors import NeuronpackError

FRAMEWORKS = ("nxd", "tnx", "vneuron", "torch")
ENV_FRAMEWORK = "NEURONPACK_FRAMEWORK"
ENV_VLLM_FRAMEWORK = "VLLM_NEURON_FRAMEWORK"
FRAMEWORK_MODULES = {"nxd": "neuronx_distributed_inference", "tnx": "transformers_neuronx"}


@dataclass(frozen=True)
class FrameworkChoice:
    name: str  # "nxd" | "tnx" | "torch"
    reason: str


def choose_framework(requested: str | None = "auto", environ: Mapping[str, str] | None = None) -> FrameworkChoice:
    """The framework to build with, and a one-line reason (shown by compile and doctor).

    Example::

        choose_framework("nxd").reason                                     # "requested nxd explicitly"
        choose_framework("auto", {"NEURONPACK_FRAMEWORK": "tnx"}).name     # "tnx"
        choose_framework("auto", {"VLLM_NEURON_FRAMEWORK": "transformers-neuronx"}).name   # "tnx"
    """
    environ = os.environ if environ is None else environ
    requested = (requested or "auto").strip().lower()
    if requested != "auto":
        if requested not in FRAMEWORKS:
            raise NeuronpackError(
                f"unknown framework {requested!r}", where="--framework / target.framework",
                fix=f"use one of auto, {', '.join(FRAMEWORKS)}",
            )
        return FrameworkChoice(requested, f"requested {requested} explicitly")
    forced = environ.get(ENV_FRAMEWORK, "").strip().lower()
    if forced and forced != "auto":
        if forced not in FRAMEWORKS:
            raise NeuronpackError(
                f"{ENV_FRAMEWORK}={forced!r} is not a framework", where=ENV_FRAMEWORK,
                fix=f"set it to one of {', '.join(FRAMEWORKS)} or unset it",
            )
        return FrameworkChoice(forced, f"{ENV_FRAMEWORK}={forced}")
    vllm_value = environ.get(ENV_VLLM_FRAMEWORK, "").strip()
    if vllm_value:
        if vllm_value not in VLLM_FRAMEWORK_NAMES:
            raise NeuronpackError(
                f"{ENV_VLLM_FRAMEWORK}={vllm_value!r} is not a value vLLM understands", where=ENV_VLLM_FRAMEWORK,
                fix=f"set it to {' or '.join(VLLM_FRAMEWORK_NAMES)} or unset it",
            )
        name = VLLM_FRAMEWORK_NAMES[vllm_value]
        return FrameworkChoice(name, f"{ENV_VLLM_FRAMEWORK}={vllm_value}")
    return auto_framework()


def auto_framework() -> FrameworkChoice:
    """The SDK 2.31+ plugin when installed, else vLLM's order: NxD Inference if it imports, else
    transformers-neuronx, else the portable torch backend."""
    plugin = probe_package("vllm_neuron", "vllm-neuron")
    if plugin.ok and is_new_plugin(plugin.version):
        return FrameworkChoice("vneuron", f"auto: vllm-neuron {plugin.version} is the SDK 2.31+ vLLM Neuron plugin")
    nxd = probe_package(FRAMEWORK_MODULES["nxd"])
    if nxd.ok:
        return FrameworkChoice("nxd", f"auto: {nxd.reason}")
    tnx = probe_package(FRAMEWORK_MODULES["tnx"])
    if tnx.ok:
        return FrameworkChoice("tnx", f"auto: {tnx.reason} ({nxd.reason})")
    return FrameworkChoice("torch", f"auto: no Neuron framework here ({nxd.reason}; {tnx.reason}); "
                                    "using the portable torch backend")


def get_backend(name: str) -> Backend:
    """The backend object for a framework name. Heavy SDKs are imported only when a backend builds.

    Example::

        get_backend("tnx").versions()   # {"neuronpack": "0.1.0", "transformers-neuronx": "absent", ...}
    """
    if name == "nxd":
        from neuronpack.backends.nxd.backend import NxdBackend

        return NxdBackend()
    if name == "tnx":
        from neuronpack.backends.tnx.backend import TnxBackend

        return TnxBackend()
    if name == "vneuron":
        from neuronpack.backends.vneuron.backend import VneuronBackend

        return VneuronBackend()
    if name == "torch":
        from neuronpack.backends.torch_aot import TorchAotBackend

        return TorchAotBackend()
    raise NeuronpackError(f"unknown framework {name!r}", where="framework", fix=f"use one of {', '.join(FRAMEWORKS)}")
