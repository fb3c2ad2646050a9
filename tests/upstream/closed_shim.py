"""A strict stand-in for the closed Neuron packages, so upstream NxD Inference's own Python runs on a CPU.

NxDI 0.9.0 and NxD 2.29 import ``torch_neuronx``, ``neuronxcc``, ``nki``, ``nkilib``, ``libneuronxla`` and
``torch_xla`` at module level (kernels, tracing, XLA ops), none of which is installable here. ``install()`` serves an
empty module for each of those names. Every attribute is a closed stand-in class (``_closed``): subclassable
(upstream subclasses a few), usable as a decorator while modules import (``nki.jit`` and friends wrap kernels at
import time), and otherwise inert. ``seal()`` ends the import phase: from then on any call of a closed object raises
``ClosedCall`` and is recorded in ``CALLS``, so a test can prove that set-up, loading and a CPU forward ran only open
code (an upstream ``try`` that swallowed the error still leaves its record). The one exception is ``CONFIG_OBJECTS``,
closed config classes open set-up code constructs and never runs.

The one closed function that needs a real answer is ``torch_neuronx.utils.get_platform_target`` (NeuronConfig's
constructor stores it); it returns the platform target, as on a build box with NEURON_PLATFORM_TARGET_OVERRIDE.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
import types

ROOTS = ("torch_neuronx", "neuronxcc", "nki", "nkilib", "libneuronxla", "torch_xla")
CALLS: list[str] = []
# Closed objects that open set-up code constructs and never runs: NxD's model-parallel set-up builds a
# context-parallel CollectivesConfig (unused at cp 1); NxD's MoE experts build an NKI kernel option, SkipMode
# (neuronx_distributed/modules/moe/expert_mlps_v2.py:89), read only by the blockwise kernels a CPU run never calls.
# They give a stand-in after sealing too.
CONFIG_OBJECTS = frozenset({"neuronxcc.nki._pre_prod_kernels.collectives.CollectivesConfig",
                            "nkilib.core.moe.moe_cte.moe_cte_utils.SkipMode"})
_state = {"sealed": False, "platform": "trn1"}


class ClosedCall(RuntimeError):
    """A closed Neuron package was called after import: the CPU path is not open code."""


class _ClosedMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _closed(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        if not _state["sealed"] or cls.__qualname__ in CONFIG_OBJECTS:  # import time: a decorator or a default
            return _decorator_or_value(cls.__qualname__, args)
        CALLS.append(cls.__qualname__)
        raise ClosedCall(f"closed Neuron code called on the CPU path: {cls.__qualname__}")

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__


def _closed(qualname: str) -> type:
    """A fresh closed stand-in named ``qualname`` (a class, so upstream may subclass it or use it as a type)."""
    return _ClosedMeta(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname, "__module__": "closed"})


def _decorator_or_value(qualname: str, args: tuple):
    # ``@nki.jit`` gets the function: hand it back. ``nki_jit()`` / ``CollectivesConfig(...)``: another stand-in.
    if len(args) == 1 and callable(args[0]) and not isinstance(args[0], _ClosedMeta):
        return args[0]
    return _closed(qualname + "()")


def _platform_target(*_args, **_kwargs) -> str:
    return _state["platform"]


class _Module(types.ModuleType):
    def __init__(self, name: str):
        super().__init__(name)
        self.__path__ = []
        self.__file__ = f"<closed {name}>"
        if name in ("torch_neuronx.utils", "torch_neuronx.utils.utils"):
            self.get_platform_target = _platform_target

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        value = _closed(f"{self.__name__}.{attr}")
        setattr(self, attr, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ROOTS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Module(spec.name)

    def exec_module(self, module):
        pass


def install(platform: str = "trn1") -> None:
    """Serve the closed packages (before anything imports NxDI), and ``torch.classes.neuron``'s two classes."""
    import torch

    _state["platform"] = platform
    sys.meta_path.insert(0, _Finder())
    for name in [n for n in sys.modules if n.split(".")[0] in ROOTS]:
        del sys.modules[name]
    neuron = types.SimpleNamespace(SPMDModel=_closed("torch.classes.neuron.SPMDModel"),
                                   LayoutTransformation=_closed("torch.classes.neuron.LayoutTransformation"))
    classes = torch.classes
    original = type(classes).__getattr__

    def getattr_(self, name):  # torch.classes is a module-like object that resolves names lazily
        return neuron if name == "neuron" else original(self, name)

    type(classes).__getattr__ = getattr_


def seal() -> None:
    """End of imports: every later call of closed code raises and is recorded."""
    _state["sealed"] = True


# The one CPU-only substitution of upstream code (an upstream limit, docs/neuron.md): NxDI's layer-boundary markers
# (models/layer_boundary_marker.py:18, wrapped round every Qwen3-MoE decoder layer at modeling_qwen3_moe.py:410) are
# XLA custom calls, a compiler hint that returns its inputs unchanged; on the CPU they cannot run, so the harness makes
# them the identity they are in value. neuronpack's own code never does this (its CPU check reports such a model as
# not scorable), and nothing of it reaches an artifact.
SUBSTITUTED = ("neuronx_distributed_inference.models.layer_boundary_marker.ModuleMarkerStartWrapper.forward",
               "neuronx_distributed_inference.models.layer_boundary_marker.ModuleMarkerEndWrapper.forward")
_ORIGINALS: dict = {}


def _identity(self, *args):
    return args[0] if len(args) == 1 else args


def substitute_for_cpu() -> None:
    """Make the layer-boundary markers the identity (SUBSTITUTED); call after NxDI imported, before ``seal()``."""
    from neuronx_distributed_inference.models import layer_boundary_marker as markers

    for wrapper in (markers.ModuleMarkerStartWrapper, markers.ModuleMarkerEndWrapper):
        _ORIGINALS.setdefault(wrapper, wrapper.forward)
        wrapper.forward = _identity


@contextlib.contextmanager
def upstream_markers():
    """Upstream's own markers back for a block (what a CPU without this harness runs)."""
    for wrapper, forward in _ORIGINALS.items():
        wrapper.forward = forward
    try:
        yield
    finally:
        for wrapper in _ORIGINALS:
            wrapper.forward = _identity
