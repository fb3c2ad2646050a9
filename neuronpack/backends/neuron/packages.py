"""Cheap, cached probes of the AWS Neuron packages and the machine (what `doctor` and framework selection read).

PyPI's ``neuronx-distributed-inference``, ``transformers-neuronx`` and ``torch-neuronx`` are ~1.5 kB placeholders:
their metadata says "WRONG PACKAGE" and they install a hyphenated directory (so the module is missing) or a module
whose import raises. Both count as absent, with a reason naming the package and where the real one comes from.

Versions come from ``importlib.metadata`` only (no import), so the manifest/key path stays torch-free.

Example::

    status = probe_package("neuronx_distributed_inference")
    status.state     # "ok" | "placeholder" | "broken" | "missing"
    status.reason    # "neuronx-distributed-inference 0.1.0 from PyPI is a placeholder ..."
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import os
import platform
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from neuronpack.backends.base import Availability

NEURON_REPO = "https://pip.repos.neuron.amazonaws.com"
PLACEHOLDER_MARK = "WRONG PACKAGE"

# module name -> distribution name, in the order doctor shows them
NEURON_MODULES: dict[str, str] = {
    "neuronx_distributed_inference": "neuronx-distributed-inference",
    "transformers_neuronx": "transformers-neuronx",
    "torch_neuronx": "torch-neuronx",
    "neuronx_distributed": "neuronx-distributed",
    "neuronxcc": "neuronx-cc",
    "libneuronxla": "libneuronxla",
    "vllm": "vllm",
    "vllm_neuron": "vllm-neuron",
}

# environment variables that change what neuronpack, NxDI, TNx or vLLM do
RELEVANT_ENV = (
    "NEURONPACK_FRAMEWORK",
    "VLLM_NEURON_FRAMEWORK",
    "NEURON_COMPILED_ARTIFACTS",
    "NEURON_PLATFORM_TARGET_OVERRIDE",
    "NEURON_LOGICAL_NC_CONFIG",
    "NEURON_RT_VISIBLE_CORES",
    "NEURON_CC_FLAGS",
    "NEURON_CONTEXT_LENGTH_BUCKETS",
    "NEURON_TOKEN_GEN_BUCKETS",
    "NEURON_QUANT_DTYPE",
    "NEURONPACK_ARTIFACTS_ROOT",
    "NEURONPACK_CACHE_DIR",
    "BASE_COMPILE_WORK_DIR",
    # the SDK 2.31+ plugin's: where its compile cache is, which route compiles, what a pod must not have set
    "VLLM_CACHE_ROOT",
    "NEURON_LIBTORCH_CACHE_ROOT",
    "VLLM_NEURON_BACKEND",
    "TORCH_CACHING_PRECOMPILE",
    "VLLM_NEURON_CPU_COMPILE",
    "VLLM_NEURON_DISABLE_WARMUP_COMPILE",
    "NEURON_LIBTORCH_REMOTE_CACHE",
)


@dataclass(frozen=True)
class PackageStatus:
    module: str
    dist: str
    state: str  # "ok" | "placeholder" | "broken" | "missing"
    version: str | None  # from the installed distribution's metadata, if any
    reason: str

    @property
    def ok(self) -> bool:
        return self.state == "ok"

    def to_dict(self) -> dict:
        return asdict(self)


def dist_version(dist: str) -> str | None:
    """The installed version of a distribution, from its metadata only (no import); None when not installed.

    Example::

        dist_version("neuronx-cc")   # "2.19.8089.0+8ab9f450" on a Neuron box, None here
    """
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def probe_package(module: str, dist: str | None = None) -> PackageStatus:
    """Whether ``module`` really imports here (cached for the process; see ``clear_probe_cache``).

    Example::

        probe_package("transformers_neuronx").state   # "missing"
    """
    dist = dist or NEURON_MODULES.get(module, module.replace("_", "-"))
    version = dist_version(dist)
    placeholder = _is_placeholder(dist)
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        spec, find_error = None, exc
    else:
        find_error = None
    if spec is None:
        if placeholder:
            return PackageStatus(module, dist, "placeholder", version, _placeholder_reason(dist, version))
        detail = f" ({find_error})" if find_error else ""
        return PackageStatus(module, dist, "missing", version, f"{dist} is not installed{detail}")
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure means "cannot use it here"; we report it
        message = f"{type(exc).__name__}: {exc}".strip()
        if placeholder or PLACEHOLDER_MARK in message:
            return PackageStatus(module, dist, "placeholder", version, _placeholder_reason(dist, version))
        return PackageStatus(module, dist, "broken", version, f"import {module} failed: {message}"[:300])
    return PackageStatus(module, dist, "ok", version, f"{dist} {version or '(version unknown)'} imports")


def clear_probe_cache() -> None:
    """Forget cached probes (tests that put stand-in packages on sys.path call this)."""
    probe_package.cache_clear()
    _is_placeholder.cache_clear()
    importlib.invalidate_caches()


def probe_all() -> list[PackageStatus]:
    """Every package in NEURON_MODULES, in display order."""
    return [probe_package(module, dist) for module, dist in NEURON_MODULES.items()]


def sdk_availability(module: str) -> Availability:
    """Whether a Neuron framework (``module``) and the Neuron compiler can build here, and why not."""
    package = probe_package(module)
    if not package.ok:
        return Availability(False, package.reason)
    cc = probe_package("neuronxcc", "neuronx-cc")
    if cc.state in ("missing", "placeholder"):
        return Availability(False, f"the Neuron compiler is absent: {cc.reason}")
    return Availability(True, package.reason)


def versions_of(dists: tuple[str, ...]) -> dict[str, str]:
    """``{dist: version or "absent"}`` from metadata only (what backends put into the key and manifest)."""
    return {dist: dist_version(dist) or "absent" for dist in dists}


def neuron_devices(dev: Path = Path("/dev")) -> list[str]:
    """Neuron device nodes present (``/dev/neuron0`` ...); empty on a build box."""
    try:
        return sorted(p.name for p in dev.glob("neuron[0-9]*"))
    except OSError:
        return []


def instance_type() -> str | None:
    """The EC2 instance type from DMI (``trn1.32xlarge``), or None off EC2 / when unreadable."""
    for path in ("/sys/devices/virtual/dmi/id/product_name",):
        try:
            value = Path(path).read_text().strip()
        except OSError:
            continue
        if value:
            return value
    return None


def relevant_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The Neuron / neuronpack / vLLM variables that are set, by name."""
    return {name: environ[name] for name in RELEVANT_ENV if name in environ}


def python_info() -> dict:
    return {"version": platform.python_version(), "executable": sys.executable, "platform": platform.platform()}


# --- private ---------------------------------------------------------------------------------------------------------
@functools.cache
def _is_placeholder(dist: str) -> bool:
    try:
        meta = importlib.metadata.metadata(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    text = " ".join(str(meta.get(k) or "") for k in ("Summary", "Description")) + str(meta.get_payload() or "")
    return PLACEHOLDER_MARK in text


def _placeholder_reason(dist: str, version: str | None) -> str:
    return (
        f"{dist} {version or ''} from PyPI is a placeholder ('{PLACEHOLDER_MARK}'); the real package comes from "
        f"AWS's repository {NEURON_REPO} on Neuron machines"
    ).replace("  ", " ")


