"""What the installed plugin itself makes of the pod's environment (run by pod.py in vLLM's Python, with vLLM's
environment, before vLLM starts): the compile-cache root each of its resolvers gives, and the value each guard
variable neuronpack sets has for it. One JSON object on stdout, always (a module that does not import is reported,
not raised).

- ``roots``: ``get_neuron_compile_cache_dir()`` of ``vllm_neuron.envs`` (0.21's source; 0.24's docs name the same
  function) and of ``libtorch_neuronx_lite.envs`` (0.24's cache library, where it has one: a third-party README says it
  honours ``NEURON_LIBTORCH_CACHE_ROOT`` first);
- ``guards``: ``{variable: {module: value}}`` for each module that defines the variable (0.21's ``envs.__getattr__``
  raises AttributeError for a name it does not read; a 0.24 ``vllm_neuron.envs`` hands ``NEURON_LIBTORCH_*`` names
  to ``libtorch_neuronx_lite.envs``).

Example::

    python -m neuronpack.backends.vneuron.probe
    # {"errors": {}, "guards": {"VLLM_NEURON_DISABLE_WARMUP_COMPILE": {"vllm_neuron.envs": true}, ...},
    #  "roots": {"vllm_neuron.envs": "/tmp/neuronpack-vllm/41300ba5.../neuron/compile_cache"}}
"""

from __future__ import annotations

import importlib
import json

from neuronpack.backends.vneuron.variables import POD_VARIABLES

RESOLVERS = ("vllm_neuron.envs", "libtorch_neuronx_lite.envs")
# the variables the pod's environment turns on so that a graph the artifact lacks is an error, not a compile
GUARDS = tuple(v.name for v in POD_VARIABLES if v.value == "1")


def probe() -> dict:
    out: dict = {"roots": {}, "guards": {}, "errors": {}}
    for name in RESOLVERS:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - reported: the caller decides what a missing module means
            out["errors"][name] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        resolve = getattr(module, "get_neuron_compile_cache_dir", None)
        if callable(resolve):
            out["roots"][name] = str(resolve())
        for guard in GUARDS:
            try:
                value = getattr(module, guard)
            except AttributeError:
                continue
            except Exception as exc:  # noqa: BLE001 - e.g. a lazy fall-through whose library does not import
                out["errors"][f"{name}.{guard}"] = f"{type(exc).__name__}: {exc}"[:300]
                continue
            out["guards"].setdefault(guard, {})[name] = bool(value)
    return out


if __name__ == "__main__":
    print(json.dumps(probe(), sort_keys=True))
