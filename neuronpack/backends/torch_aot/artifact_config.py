"""A portable artifact's configuration: the typed, frozen ``ArtifactConfig``, and the one reader and writer of
its file, ``neuron_config.json`` (torch-free).

The build makes one from the recipe and the plan (``build.artifact_config``: what is compiled), completes it with
what only the build knows (``ArtifactConfig.built``: the graphs, the layer kinds, whether the graphs call the
kernels) and writes it; the loader, the compile workers and ``validate_artifact`` read it back. The file keeps NxDI's
name and key names (``tp_degree``, ``context_encoding_buckets``...): it is the same information, and readers of
artifacts already built (tests, benches, the manifest's ``compile_config``) read those keys. Its version is the
artifact format's (``layout.FORMAT_VERSION``): another version is refused; a file without ``format_version`` reads
as the current one.

Example::

    config = read_artifact_config(artifact_dir)
    config.batch_size, config.context_encoding_buckets       # 2, (16, 64)
    config.speculation.kind if config.speculation else None  # "eagle"
    write_artifact_config(staging, config)                   # the same bytes as the file it was read from
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuronpack.backends.torch_aot.layout import FORMAT, FORMAT_VERSION, NEURON_CONFIG
from neuronpack.errors import ArtifactError

__all__ = ["ArtifactConfig", "LoraAdapterEntry", "LoraConfig", "SpeculationSection", "read_artifact_config",
           "write_artifact_config"]

REBUILD = "recompile it (neuronpack compile --force)"


@dataclass(frozen=True)
class SpeculationSection:
    """What the runtime speculates with: prompt lookup (its n-gram sizes) or an EAGLE draft (its directory inside
    the artifact, the dtype it runs in; after the build its layout and, for EAGLE-3, the target layers it reads)."""

    kind: str  # "eagle" | "prompt_lookup"
    length: int
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    draft: str | None = None
    draft_dtype: str | None = None
    layout: str | None = None  # "eagle1" | "eagle3", recorded by the build
    target_layers: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.kind != "eagle":
            return {"kind": self.kind, "length": self.length, "prompt_lookup_min": self.prompt_lookup_min,
                    "prompt_lookup_max": self.prompt_lookup_max}
        out = {"kind": self.kind, "length": self.length, "draft": self.draft, "draft_dtype": self.draft_dtype}
        if self.layout is not None:
            out |= {"layout": self.layout,
                    "target_layers": list(self.target_layers) if self.target_layers is not None else None}
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str) -> SpeculationSection:
        data = _mapping("speculation", data, where)
        layers = _opt(_ints)("speculation.target_layers", data.get("target_layers"), where)
        return cls(kind=_str("speculation.kind", data.get("kind"), where),
                   length=_int("speculation.length", data.get("length"), where),
                   prompt_lookup_min=_opt(_int)("speculation.prompt_lookup_min", data.get("prompt_lookup_min"), where),
                   prompt_lookup_max=_opt(_int)("speculation.prompt_lookup_max", data.get("prompt_lookup_max"), where),
                   draft=_opt(_str)("speculation.draft", data.get("draft"), where),
                   draft_dtype=_opt(_str)("speculation.draft_dtype", data.get("draft_dtype"), where),
                   layout=_opt(_str)("speculation.layout", data.get("layout"), where), target_layers=layers)


@dataclass(frozen=True)
class LoraAdapterEntry:
    """One adapter of the artifact: its name, its PEFT copy (``lora/<name>``, relative to the artifact), its rank."""

    name: str
    path: str
    rank: int


@dataclass(frozen=True)
class LoraConfig:
    """The LoRA layout the graphs are compiled for and the resident adapters in slot order (slot k + 1 is
    ``adapters[k]``)."""

    max_loras: int
    max_rank: int
    target_modules: tuple[str, ...]
    adapters: tuple[LoraAdapterEntry, ...]

    @property
    def adapter_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.adapters)

    def to_dict(self) -> dict[str, Any]:
        return {"max_loras": self.max_loras, "max_rank": self.max_rank, "target_modules": list(self.target_modules),
                "adapters": [dataclasses.asdict(a) for a in self.adapters]}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> LoraConfig:
        data = _mapping("lora", data, where)
        adapters = data.get("adapters")
        if not isinstance(adapters, list):
            raise _bad("lora.adapters", "a list", adapters, where)
        entries = []
        for i, a in enumerate(adapters):
            a = _mapping(f"lora.adapters[{i}]", a, where)
            entries.append(LoraAdapterEntry(_str(f"lora.adapters[{i}].name", a.get("name"), where),
                                            _str(f"lora.adapters[{i}].path", a.get("path"), where),
                                            _int(f"lora.adapters[{i}].rank", a.get("rank"), where)))
        return cls(max_loras=_int("lora.max_loras", data.get("max_loras"), where),
                   max_rank=_int("lora.max_rank", data.get("max_rank"), where),
                   target_modules=_strs("lora.target_modules", data.get("target_modules"), where),
                   adapters=tuple(entries))


def _int(key: str, value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(key, "an integer", value, where)
    return value


def _str(key: str, value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _bad(key, "a string", value, where)
    return value


def _bool(key: str, value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(key, "true or false", value, where)
    return value


def _ints(key: str, value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise _bad(key, "a list of integers", value, where)
    return tuple(_int(key, v, where) for v in value)


def _strs(key: str, value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _bad(key, "a list of strings", value, where)
    return tuple(_str(key, v, where) for v in value)


def _mapping(key: str, value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(key, "an object", value, where)
    return value


def _graphs(key: str, value: Any, where: str) -> dict[str, str]:
    return {_str(key, k, where): _str(f"{key}.{k}", v, where) for k, v in _mapping(key, value, where).items()}


def _opt(read: Callable) -> Callable:
    return lambda key, value, where: None if value is None else read(key, value, where)


def _section(cls) -> Callable:
    return lambda key, value, where: cls.from_dict(value, where)


def _bad(key: str, expected: str, value: Any, where: str) -> ArtifactError:
    return ArtifactError(f"{NEURON_CONFIG}: {key} must be {expected}, got {value!r}"[:300], where=where, fix=REBUILD)


@dataclass(frozen=True)
class ArtifactConfig:
    """What a portable artifact was compiled for and how; the fields are ``neuron_config.json``'s keys, in its
    order. ``target``: what the graphs are specific to (``target.current_target``: torch, CPU capability, C++
    compiler, inductor settings); ``graphs``: graph name -> its model name in ``graphs.pt2``; ``layer_graphs``: each
    layer's kind (``graphs.layer_groups``)."""

    compiler: str  # "aoti" | "export"
    batch_size: int
    ctx_batch_size: int
    tkg_batch_size: int
    seq_len: int
    max_context_length: int
    max_length: int
    enable_bucketing: bool
    context_encoding_buckets: tuple[int, ...]
    token_generation_buckets: tuple[int, ...]
    torch_dtype: str
    kv_cache_dtype: str
    tp_degree: int
    padding_side: str
    is_continuous_batching: bool
    quantized: bool
    quantization_dtype: str | None
    model_type: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_cache_positions: int  # positions per cache row: seq_len + 1 (layout.cache_positions)
    vocab_size: int
    max_step_tokens: int  # tokens (and logits) per row one step runs
    speculation: SpeculationSection | None
    target: Mapping[str, Any]
    lora: LoraConfig | None
    # Positions a sliding-window layer's cache row keeps, a ring (its window + the speculation length: room for a
    # verify step's rejected tokens); None: every layer keeps every position (absent from the file then)
    kv_ring: int | None = None
    # What only the build knows (None before it: absent from compile_config)
    linear_kernels: bool | None = None  # the graphs' linears call torch.ops.neuronpack.* (aoti)
    layer_graphs: tuple[int, ...] | None = None
    graphs: Mapping[str, str] | None = None
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    @property
    def adapter_names(self) -> tuple[str, ...]:
        """The artifact's LoRA adapters in slot order; () without LoRA."""
        return self.lora.adapter_names if self.lora else ()

    @property
    def kernels(self) -> bool:
        return bool(self.linear_kernels)

    def built(self, *, linear_kernels: bool, layer_graphs: list[int], graphs: dict[str, str],
              speculation: SpeculationSection | None) -> ArtifactConfig:
        """This config completed with what the build decides from the loaded model."""
        return dataclasses.replace(self, linear_kernels=linear_kernels, layer_graphs=tuple(layer_graphs),
                                   graphs=dict(graphs), speculation=speculation)

    def to_dict(self) -> dict[str, Any]:
        """The file's JSON object (fields the build has not set yet are left out)."""
        out = {"format": self.format, "format_version": self.format_version}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in out or (value is None and f.name in (*BUILT, "kv_ring")):
                continue
            out[f.name] = _plain(value)
        return out

    def compile_config(self) -> dict[str, Any]:
        """What the manifest records as ``compile_config`` (and ``--dry-run`` prints): ``to_dict`` without the
        target, which the manifest records separately."""
        out = self.to_dict()
        out.pop("target")
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = NEURON_CONFIG) -> ArtifactConfig:
        """Validate ``data`` (a parsed ``neuron_config.json``) field by field; ArtifactError names the first bad
        key. A missing ``format_version`` reads as the current one; the caller checks format and version."""
        data = _mapping("(the file)", data, where)
        readers = _readers()
        values = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                if f.default is dataclasses.MISSING:
                    raise ArtifactError(f"{NEURON_CONFIG} has no {f.name}", where=where, fix=REBUILD)
                continue
            values[f.name] = readers[f.name](f.name, data[f.name], where)
        return cls(**values)


BUILT = ("linear_kernels", "layer_graphs", "graphs")


@functools.cache
def _readers() -> dict[str, Callable]:
    """Field name -> the function that checks and converts its JSON value, chosen by the field's type."""
    by_type: dict[Any, Callable] = {
        int: _int, str: _str, bool: _bool, tuple[int, ...]: _ints, Mapping[str, Any]: _mapping,
        Mapping[str, str]: _graphs, SpeculationSection: _section(SpeculationSection), LoraConfig: _section(LoraConfig),
    }
    readers = {}
    for name, hint in typing.get_type_hints(ArtifactConfig).items():
        args = typing.get_args(hint)
        if type(None) in args and isinstance(hint, types.UnionType):  # X | None
            (inner,) = (a for a in args if a is not type(None))
            readers[name] = _opt(by_type[inner])
        else:
            readers[name] = by_type[hint]
    return readers


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, SpeculationSection | LoraConfig):
        return value.to_dict()
    if isinstance(value, Mapping):
        return dict(value)
    return value


def read_artifact_config(artifact_dir: Path) -> ArtifactConfig:
    """The artifact's ``neuron_config.json``, checked to be a portable (torch) artifact of the format this
    neuronpack runs, as an ``ArtifactConfig``."""
    path = Path(artifact_dir) / NEURON_CONFIG
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"cannot read {NEURON_CONFIG}: {exc}", where=str(path),
                            fix="rebuild it with neuronpack compile --framework torch") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise ArtifactError(f"not a torch-backend artifact (format {found!r})", where=str(path),
                            fix="serve it with the framework it was compiled for, or recompile with --framework torch")
    version = data.get("format_version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise ArtifactError(f"artifact format {version} is not the format this neuronpack runs ({FORMAT_VERSION})",
                            where=str(path), fix=REBUILD)
    return ArtifactConfig.from_dict(data, where=str(path))


def write_artifact_config(artifact_dir: Path, config: ArtifactConfig) -> None:
    """Write ``neuron_config.json`` (sorted keys, two-space indent: the bytes every build has written)."""
    (Path(artifact_dir) / NEURON_CONFIG).write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")
