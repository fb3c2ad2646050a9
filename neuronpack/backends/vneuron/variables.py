"""The plugin's environment variables neuronpack relies on at a vneuron pod's start, each with where its name and
meaning were confirmed: the one table serve's environment (launch.py) and `neuronpack doctor` read (torch-free).

Sources: vllm-neuron 0.21's own code (../shared/upstream/vllm-neuron-0.21: envs.py, compile/backend.py,
compile/capture_backend.py, compile/parallel_compile.py) and, for 0.24 (SDK 2.32, whose cache code moved into
libtorch-neuronx-lite, not readable here), AWS's vllm-neuron docs: design/compilation/compilation_cache.md and
cpu_compilation.md (2026-06-22), model-dev/cpu-development.md, guides/reference-configuration.md. A name found only in
third-party code is marked unconfirmed and neuronpack does not rely on it.

Example::

    [v.name for v in POD_VARIABLES if v.value == "1"]   # ["VLLM_NEURON_DISABLE_WARMUP_COMPILE", ...]
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class PodVariable:
    name: str
    value: str | None  # what the pod's environment sets it to; None: left unset (or, for the root, a directory)
    role: str
    confirmed: str  # where the name and its meaning come from, or "unconfirmed: ..."

    def to_dict(self) -> dict:
        return asdict(self)


CACHE_ROOT = "VLLM_CACHE_ROOT"  # its value is the pod's own directory (launch.default_cache_base)
POD_VARIABLES: tuple[PodVariable, ...] = (
    PodVariable(CACHE_ROOT, None, "the local compile cache is $VLLM_CACHE_ROOT/neuron/compile_cache; neuronpack fills "
                "it from the artifact at every start",
                "0.21 envs.py get_neuron_compile_cache_dir; 0.24 compilation_cache.md (same path)"),
    PodVariable("VLLM_NEURON_DISABLE_WARMUP_COMPILE", "1", "a local cache miss raises instead of compiling",
                "0.21 compile/backend.py compile(); 0.24 compilation_cache.md and cpu_compilation.md (name kept)"),
    PodVariable("VLLM_NEURON_DISABLE_GRAPH_CAPTURE_BACKEND", "1", "no graph capture + parallel compile at start "
                "(that path compiles every local miss, remote cache and hit assertion unconsulted)",
                "0.21 envs.py, vllm/worker/neuron_worker.py, compile/parallel_compile.py"),
    PodVariable("NEURON_LIBTORCH_DISABLE_GRAPH_CAPTURE_BACKEND", "1", "the same, under 0.24's name",
                "0.24 cpu_compilation.md ('Preventing Compilation on Production Instances'), cpu-development.md"),
    PodVariable("VLLM_NEURON_DISABLE_COMPILE_CACHE", "0", "the compile cache stays on", "0.21 envs.py, backend.py"),
    PodVariable("NEURON_LIBTORCH_DISABLE_COMPILE_CACHE", "0", "the same, under 0.24's name",
                "0.24 compilation_cache.md"),
    PodVariable("VLLM_NEURON_CPU_COMPILE", "0", "a device start, not a CPU compile", "0.21 envs.py; 0.24 docs"),
    PodVariable("VLLM_NEURON_REMOTE_CACHE", None, "not set: every graph is in the local root",
                "0.21 envs.py (0.24 renamed it NEURON_LIBTORCH_REMOTE_CACHE: compilation_cache.md)"),
    PodVariable("NEURON_LIBTORCH_ASSERT_CACHE_HIT", None, "not set and not relied on",
                "unconfirmed: no AWS page names it; it is 0.21's VLLM_NEURON_ASSERT_CACHE_HIT renamed by analogy, "
                "and only third-party run scripts set it"),
    PodVariable("NEURON_LIBTORCH_CACHE_ROOT", None, "must be unset on the pod: checked at start against the plugin's "
                "own resolvers", "unconfirmed: a third-party README says 0.24's libtorch_neuronx_lite.envs reads it "
                "before VLLM_CACHE_ROOT"),
)


def guard_env() -> dict[str, str]:
    """The variables the pod sets to a fixed value (the cache root is added by launch.py)."""
    return {v.name: v.value for v in POD_VARIABLES if v.value is not None}
