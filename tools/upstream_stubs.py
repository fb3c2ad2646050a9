"""Import upstream source without its device-only or heavy dependencies (used by tools/upstream_check_worker.py).

``install(names)`` puts a finder last on sys.meta_path that serves an empty stand-in module for each listed top-level
name (torch_neuronx, neuronx_distributed, ...): capitalised attributes are subclassable empty classes, the rest are
MagicMocks. Upstream's own packages (vllm, vllm_neuron, neuronx_distributed_inference) are never stubbed.
"""

import importlib.abc
import importlib.machinery
import sys
import types
from unittest import mock

REAL = ("vllm", "vllm_neuron", "neuronx_distributed_inference")
STUBBED = set()

class _StubMeta(type):
    """Class-level attributes of a stand-in class are MagicMocks too (NxD's MoE configs read enum members of
    nkilib's BlockShardStrategy as class defaults)."""
    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return mock.MagicMock(name=f"{cls.__name__}.{name}")


class _Stub(types.ModuleType):
    def __init__(self, name):
        super().__init__(name)
        self.__path__ = []
        self.__file__ = f"<stub {name}>"
    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        if attr[:1].isupper() and not attr.isupper():
            value = _StubMeta(attr, (), {"__init__": lambda self, *a, **k: None,
                                    "__getattr__": lambda self, n: mock.MagicMock(name=n),
                                    "__class_getitem__": classmethod(lambda cls, item: cls)})
            value.__module__ = self.__name__
        else:
            value = mock.MagicMock(name=f"{self.__name__}.{attr}")
        setattr(self, attr, value)
        return value

class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, forced=(), real=()):
        self.forced = set(forced)
        self.real = set(real)  # pure submodules of a stubbed package that are imported for real

    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in REAL or name in self.real or any(r.startswith(name + ".") for r in self.real):
            return None
        if top in self.forced or name in self.forced:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        if not getattr(self, "auto", True):
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            try:
                spec = finder.find_spec(name, path, target)
            except Exception:
                spec = None
            if spec is not None:
                return None
        STUBBED.add(top)
        return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        return _Stub(spec.name)
    def exec_module(self, module):
        pass

def install(forced=(), auto=True, real=(), hidden=()):
    """Stub ``forced`` top-level names (``auto``: also anything missing); ``real`` submodules load from source;
    ``hidden`` names are not there at all (importlib.util.find_spec gives None, an import raises ImportError)."""
    for name in hidden:
        sys.modules[name] = None
    f = Finder(forced, real)
    f.auto = auto
    sys.meta_path.insert(0, f) if real else sys.meta_path.append(f)
