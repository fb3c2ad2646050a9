"""LoRA adapters in PEFT's format, read without PEFT: ``adapter_config.json`` + ``adapter_model.safetensors``.

``read_adapter`` validates an adapter against what a recipe compiles (torch-free: the safetensors header is JSON)
and returns its ``AdapterInfo``: rank, scaling and which linear of which layer it adapts. ``adapter_tensors`` reads
the A/B matrices (torch) keyed like the portable model's modules.

PEFT writes one ``lora_A`` [r, in] and one ``lora_B`` [out, r] per adapted linear, named after the wrapped model::

    base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
    base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight

and the adapted linear computes ``W x + scaling * B (A x)`` with ``scaling = lora_alpha / r`` (``lora_alpha /
sqrt(r)`` with ``use_rslora``). Options that change that formula (DoRA, a bias, fan_in_fan_out, per-module rank or
alpha patterns, extra trained modules) are refused, one clear line each.

Example::

    info = read_adapter("sql", resolve_adapter("adapters/sql"), target_modules=("q_proj", "v_proj"), max_rank=16)
    info.rank, info.scaling, info.modules     # 8, 2.0, ("q_proj", "v_proj")
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.checkpoint.hub import resolve_model
from neuronpack.checkpoint.safetensors_header import read_safetensors_header
from neuronpack.errors import CheckpointError
from neuronpack.progress import Reporter

if TYPE_CHECKING:
    import torch

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
LORA_DIR = "lora"  # adapters copied into an artifact live in lora/<name>/ (neuron_config.json names them so)
# The linears of a Llama-family layer an adapter may target, and the block each one lives in.
LINEAR_BLOCKS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
                 "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
_TENSOR = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_(A|B)\.weight")
# adapter_config.json options whose non-default value changes the arithmetic: (key, is-default test, fix)
_REFUSED: tuple[tuple[str, Any, str], ...] = (
    ("use_dora", lambda v: not v, "DoRA adapters are not supported: merge it (merge_and_unload) or train plain LoRA"),
    ("bias", lambda v: v in (None, "none"), 'train it with bias="none" (LoRA biases are not supported)'),
    ("lora_bias", lambda v: not v, "train it with lora_bias=False"),
    ("fan_in_fan_out", lambda v: not v, "Llama-family linears are not Conv1D: save the adapter with "
                                        "fan_in_fan_out=False"),
    ("rank_pattern", lambda v: not v, "per-module ranks are not supported: train one rank for every module"),
    ("alpha_pattern", lambda v: not v, "per-module alphas are not supported: train one lora_alpha"),
    ("modules_to_save", lambda v: not v, "fully trained extra modules are not supported: merge them into the "
                                         "base checkpoint"),
    ("trainable_token_indices", lambda v: not v, "trained token embeddings are not supported"),
    ("target_parameters", lambda v: not v, "parameter-targeted LoRA is not supported: target linear modules"),
    ("layer_replication", lambda v: not v, "layer replication is not supported"),
    ("alora_invocation_tokens", lambda v: not v, "activated LoRA (aLoRA) is not supported: train plain LoRA"),
    *((key, lambda v: not v, "this LoRA variant changes the forward pass; the compiled graphs apply plain LoRA "
                             "only: merge it into the base checkpoint or train plain LoRA")
      for key in ("use_qalora", "use_bdlora", "arrow_config", "kasa_config", "monteclora_config", "velora_config")),
)


@dataclass(frozen=True)
class AdapterInfo:
    """A validated PEFT LoRA adapter. ``targets`` maps (layer, module) -> (A shape, B shape)."""

    name: str
    path: Path
    rank: int
    alpha: float
    use_rslora: bool
    targets: Mapping[tuple[int, str], tuple[tuple[int, ...], tuple[int, ...]]]

    @property
    def scaling(self) -> float:
        """What PEFT multiplies ``B (A x)`` by."""
        return self.alpha / math.sqrt(self.rank) if self.use_rslora else self.alpha / self.rank

    @property
    def modules(self) -> tuple[str, ...]:
        """The linear names it adapts (``k_proj``, ``q_proj``, ...), sorted."""
        return tuple(sorted({module for _layer, module in self.targets}))


def resolve_adapter(source: str, *, reporter: Reporter | None = None) -> Path:
    """A local adapter directory as-is, or a hub id ``org/name[@revision]`` through the Hugging Face cache (like
    MODEL: ``HF_HUB_OFFLINE`` honoured, one clear line when it is not there)."""
    return resolve_model(source, reporter=reporter, marker=ADAPTER_CONFIG)


def read_adapter(name: str, path: Path, *, target_modules: Iterable[str], max_rank: int) -> AdapterInfo:
    """Read and validate the PEFT adapter in ``path`` against a recipe's ``[lora]`` (its ``target_modules`` and
    ``max_rank``). CheckpointError (what, where, how to fix) for anything the compiled graphs cannot apply."""
    path = Path(path)
    config = _read_config(name, path)
    where = f"lora adapter {name!r}: {path / ADAPTER_CONFIG}"
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise CheckpointError(f"not a LoRA adapter (peft_type {config.get('peft_type')!r})", where=where,
                              fix="give a PEFT LoRA adapter (adapter_config.json with peft_type LORA)")
    for key, is_default, fix in _REFUSED:
        if not is_default(config.get(key)):
            raise CheckpointError(f"unsupported option {key} = {config.get(key)!r}", where=where, fix=fix)
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise CheckpointError(f"r must be a positive integer, got {rank!r}", where=where, fix="fix adapter_config.json")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise CheckpointError(f"lora_alpha must be a number, got {alpha!r}", where=where,
                              fix="fix adapter_config.json")
    if rank > max_rank:
        raise CheckpointError(f"rank {rank} is above lora.max_rank {max_rank}", where=where,
                              fix=f"raise lora.max_rank in the recipe to at least {rank}")
    targets = _targets(name, path, rank, set(target_modules))
    return AdapterInfo(name=name, path=path, rank=rank, alpha=float(alpha),
                       use_rslora=bool(config.get("use_rslora", False)), targets=targets)


def adapter_tensors(info: AdapterInfo) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """(layer, module) -> (A [r, in], B [out, r]) as stored (float dtype of the file), read with safetensors."""
    from safetensors.torch import load_file

    tensors = load_file(str(info.path / ADAPTER_WEIGHTS))
    out = {}
    for layer, module in info.targets:
        prefix = f"base_model.model.model.layers.{layer}.{LINEAR_BLOCKS[module]}.{module}"
        out[(layer, module)] = (tensors[f"{prefix}.lora_A.weight"], tensors[f"{prefix}.lora_B.weight"])
    return out


def lora_path(name: str) -> str:
    """Where an adapter lives inside an artifact, relative to it."""
    return f"{LORA_DIR}/{name}"


def copy_adapters(adapters: Mapping[str, Path], dest_root: Path, relative: Mapping[str, str]) -> None:
    """Copy each adapter directory (name -> path) to ``dest_root / relative[name]``: the artifact carries them."""
    for name, source in adapters.items():
        if not Path(source).is_dir():
            raise CheckpointError(f"LoRA adapter {name!r} not found", where=str(source),
                                  fix="point lora.adapters[].path at a local PEFT adapter directory")
        dest = Path(dest_root) / relative[name]
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, dest)


def _read_config(name: str, path: Path) -> dict[str, Any]:
    file = path / ADAPTER_CONFIG
    fix = "point lora.adapters[].path at a PEFT adapter directory (save_pretrained of a PeftModel)"
    if not (path / ADAPTER_WEIGHTS).is_file():
        raise CheckpointError(f"lora adapter {name!r} has no {ADAPTER_WEIGHTS}", where=str(path), fix=fix)
    try:
        config = json.loads(file.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"lora adapter {name!r} has no {ADAPTER_CONFIG}", where=str(path), fix=fix) from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {ADAPTER_CONFIG}: {exc}", where=str(file), fix=fix) from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{ADAPTER_CONFIG} is not a JSON object", where=str(file), fix=fix)
    return config


def _targets(name: str, path: Path, rank: int, allowed: set[str]):
    file = path / ADAPTER_WEIGHTS
    where = f"lora adapter {name!r}: {file}"
    pairs: dict[tuple[int, str], dict[str, tuple[int, ...]]] = {}
    for tensor, info in read_safetensors_header(file).items():
        match = _TENSOR.fullmatch(tensor)
        if match is None or LINEAR_BLOCKS.get(match.group(3)) != match.group(2):
            raise CheckpointError(f"unexpected tensor {tensor!r}", where=where,
                                  fix="only LoRA A/B weights of a Llama-family layer's linears are supported "
                                      f"({', '.join(LINEAR_BLOCKS)})")
        module = match.group(3)
        if module not in allowed:
            listed = ", ".join(sorted(allowed))
            raise CheckpointError(f"adapts {module}, which is not in lora.target_modules ({listed})",
                                  where=where, fix=f"add {module!r} to lora.target_modules in the recipe")
        if info.dtype not in ("F32", "F16", "BF16") or len(info.shape) != 2:
            raise CheckpointError(f"tensor {tensor!r} is {info.dtype} {list(info.shape)}, not a float matrix",
                                  where=where, fix="re-save the adapter with PEFT")
        pairs.setdefault((int(match.group(1)), module), {})[match.group(4)] = info.shape
    if not pairs:
        raise CheckpointError("the adapter holds no LoRA weights", where=where, fix="re-save the adapter with PEFT")
    targets = {}
    for (layer, module), ab in sorted(pairs.items()):
        a, b = ab.get("A"), ab.get("B")
        if a is None or b is None or a[0] != rank or b[1] != rank:
            raise CheckpointError(f"layer {layer} {module}: lora_A {a} / lora_B {b} do not form a rank-{rank} pair",
                                  where=where, fix="re-save the adapter with PEFT (r in adapter_config.json must "
                                                   "match the weights)")
        targets[(layer, module)] = (a, b)
    return targets
