"""What a portable artifact is specific to, computed without importing torch (it runs on every cache-hit check).

An AOTInductor binary depends on the torch version, the CPU instruction set it was generated for, the C++ compiler
and the inductor settings; an export-only program depends on the torch version and device only.

Example::

    current_target("aoti", "cpu")
    # {"compiler": "aoti", "device": "cpu", "torch": "2.13.0+cpu", "cpu_capability": "AVX512",
    #  "cxx": {"path": "/usr/bin/g++", "version": "g++ (Debian 12.2.0-14) 12.2.0"}, "inductor": {...}, ...}
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

# The inductor settings every AOTInductor build uses: no constants inside the shared library (the graphs take the
# weights as inputs, read from weights/), every graph is packaged into one graphs.pt2.
INDUCTOR_SETTINGS: dict[str, Any] = {
    "aot_inductor.package": True,
    "aot_inductor.package_constants_in_so": False,
}

# (capability, /proc/cpuinfo flags it needs), best first: ATen's compute_cpu_capability on x86.
_X86_CAPABILITIES = (
    ("AVX512", ("avx512vl", "avx512bw", "avx512dq", "fma")),
    ("AVX2", ("avx2", "fma")),
)


def torch_version() -> str:
    """The installed torch version from package metadata (no import)."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "missing"


def cpu_capability(cpuinfo: str | None = None, env: dict[str, str] | None = None) -> str:
    """The vector ISA ATen dispatches to here ("AVX512", "AVX2", "DEFAULT"), like
    ``torch.backends.cpu.get_cpu_capability()``: ``ATEN_CPU_CAPABILITY`` can lower it, never raise it.

    Example: ``cpu_capability("flags : fma avx2", env={}) == "AVX2"``.
    """
    env = os.environ if env is None else env
    machine = platform.machine().lower()
    if cpuinfo is None and machine not in ("x86_64", "amd64", "i386", "i686"):
        return "DEFAULT"  # non-x86: only the default kernels are distinguished here
    flags = _cpu_flags(_read_cpuinfo() if cpuinfo is None else cpuinfo)
    supported = [name for name, needed in _X86_CAPABILITIES if all(f in flags for f in needed)] + ["DEFAULT"]
    requested = env.get("ATEN_CPU_CAPABILITY", "").strip().upper()
    if requested in supported:
        return requested
    return supported[0]


@functools.lru_cache(maxsize=4)
@functools.lru_cache(maxsize=8)
def cxx_compiler(cxx_env: str | None = None) -> dict[str, str] | None:
    """The C++ compiler inductor would use (``$CXX`` or g++), as ``{"path", "version"}``; None if there is none.

    Example: ``cxx_compiler()`` -> ``{"path": "/usr/bin/g++", "version": "g++ (Debian 12.2.0-14) 12.2.0"}``.
    """
    name = cxx_env if cxx_env is not None else os.environ.get("CXX", "g++")
    path = shutil.which(name)
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = (out.stdout or out.stderr).strip().splitlines()
    return {"path": path, "version": first[0] if first else "unknown"}


def effective_compiler(requested: str) -> str:
    """``"aoti"`` when asked and a C++ compiler exists, else ``"export"`` (the export-only fallback)."""
    if requested == "aoti" and cxx_compiler(os.environ.get("CXX", "g++")) is not None:
        return "aoti"
    return "export"


def current_target(compiler: str, device: str = "cpu") -> dict[str, Any]:
    """The target dict of an artifact built here with ``compiler`` ("aoti" | "export") for ``device``."""
    target: dict[str, Any] = {"compiler": compiler, "device": device, "torch": torch_version()}
    if compiler == "aoti":
        target["cpu_capability"] = cpu_capability()
        target["machine"] = platform.machine()
        target["cxx"] = cxx_compiler(os.environ.get("CXX", "g++"))
        target["inductor"] = dict(INDUCTOR_SETTINGS)
    return target


def target_mismatch(built: dict[str, Any], here: dict[str, Any]) -> str | None:
    """A sentence naming the first field that makes an artifact built for ``built`` unloadable ``here``."""
    labels = {"device": "device", "torch": "torch", "cpu_capability": "CPU capability", "machine": "machine"}
    for field, label in labels.items():
        if field in built and built.get(field) != here.get(field):
            return f"built for {label} {built[field]}, this machine has {here.get(field)}"
    return None


def _read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""


def _cpu_flags(cpuinfo: str) -> set[str]:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()
