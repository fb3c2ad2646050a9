"""Which tensors of a checkpoint get quantized, which stay as they are, and the NxDI ``modules_to_not_convert`` list.

Torch-free: it works on tensor names, dtypes and shapes from the safetensors headers, so planning (and the cache key)
never loads a weight.

Rules: every 2-D ``*.weight`` of a decoder layer (``model.layers.``; Llama 4's text decoder
``language_model.model.layers.``) is a Linear weight and is quantized (q/k/v/o_proj, gate/up/down_proj);
``lm_head.weight`` only with ``include_lm_head``; embeddings and norms always keep their dtype. Whatever the family,
what NxD Inference keeps in float stays float (``keeps_float``): a MoE block's router / gate (NxD's router is a plain
``nn.Linear``, never converted), the experts (NxDI's converters fuse them from the checkpoint's weights and drop any
scale; they are listed as ``expert_mlps`` / ``shared_experts`` in modules_to_not_convert, NxDI's module names),
attention sinks and norms (1-D), and gpt-oss's released MXFP4 experts (``*_blocks`` / ``*_scales``, carried as
they are: the one quantized input accepted). ``include_experts`` quantizes the float experts too, for the portable
backend (its routed-experts kernel reads int8 experts); the nxd backend refuses such a checkpoint.
An attention projection with a bias (Qwen2's q/k/v, all of gpt-oss's) is quantized like any Linear (the portable
backend takes it), but NxD Inference cannot load it quantized: its attention rewrites those biases in its preshard
hooks (modules/attention/gqa.py:326, for q/k/v and o) and NxD's quantized layers cannot take that
(``set_bias_to_state_dict`` raises: neuronx_distributed/quantization/quantization_layers.py:419);
``biased_projections`` names them, and the nxd backend refuses such a quantization with the --skip that avoids it.
A tied lm_head (no ``lm_head.weight``: the head is ``model.embed_tokens.weight``) with ``include_lm_head`` is untied:
the output gains a quantized ``lm_head.weight`` made from the embedding matrix (``untie_from``), the embedding stays
float for the token lookup, and config.json says ``tie_word_embeddings: false`` (NxDI then loads the head as its
own quantized layer; a decode step reads the head's int8 bytes instead of the float embedding).
A ``--skip`` glob is matched against a Linear's module prefix and every ancestor of it, with and without the
leading ``model.`` (so ``layers.0.self_attn``, ``model.layers.0.*`` and ``*.mlp.down_proj`` all work).

Example::

    plan = plan_quantization(infos, config, skip=("layers.0.mlp",), include_lm_head=False)
    plan.quantize            # ("model.layers.0.self_attn.q_proj.weight", ...)
    plan.modules_to_not_convert  # ("lm_head", "layers.0.mlp")
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Protocol

from neuronpack.errors import QuantizationError

LAYERS_PREFIX = "model.layers."
# decoder-layer prefixes, HF name -> NxDI module name: NxDI drops "model." (Llama 4's converter "language_model.model.")
TEXT_PREFIXES = ("language_model.model.", "model.")
LM_HEAD = "lm_head.weight"
# the routing linear of a MoE block (Qwen-MoE / Mixtral "gate", gpt-oss / Llama 4 "router", Qwen2-MoE's shared gate)
ROUTER_NAMES = ("gate", "router", "shared_expert_gate")
# a path component of expert weights: routed (per expert, or one [experts, ...] tensor) and shared experts, with the
# NxDI module names that hold them (NxDI's MoE v2 layers)
EXPERT_PARTS = {"experts": "expert_mlps", "shared_expert": "shared_experts", "shared_experts": "shared_experts"}
MXFP4_SUFFIXES = ("_blocks", "_scales")
EMBED = "model.embed_tokens.weight"
FLOAT_DTYPES = {"F32", "F16", "BF16", "F64"}
QUANTIZED_DTYPES = {"I8", "U8", "F8_E4M3", "F8_E5M2", "F4", "F6_E2M3", "F6_E3M2"}
# Names quantized checkpoints of common toolchains carry next to their weights.
QUANTIZED_NAME_SUFFIXES = (".scale", ".weight_scale", ".qweight", ".scales", ".SCB", ".weight_format")
CONFIG_QUANT_KEYS = ("quantization", "quantization_config", "compression_config")


class _Info(Protocol):
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class QuantPlan:
    """The outcome of planning: names in checkpoint order plus what the user's options resolved to."""

    quantize: tuple[str, ...]  # weight names to quantize ("<prefix>.weight")
    kept_linear: tuple[str, ...]  # module prefixes of Linear weights left unquantized (skipped, lm_head)
    modules_to_not_convert: tuple[str, ...]  # NxDI-style partial module names, e.g. ("lm_head", "layers.0.mlp")
    unmatched_skips: tuple[str, ...]  # --skip globs that matched no Linear (the caller warns)
    lm_head_tied: bool  # lm_head is the embedding matrix (tie_word_embeddings)
    untie_from: str | None = None  # a tied head to quantize: the embedding it is made from (written as lm_head.weight)


def module_prefix(weight_name: str) -> str:
    """``model.layers.0.mlp.up_proj.weight`` -> ``model.layers.0.mlp.up_proj``."""
    return weight_name[: -len(".weight")] if weight_name.endswith(".weight") else weight_name


def nxd_module_name(prefix: str) -> str:
    """NxDI names modules without the HF ``model.`` prefix: ``model.layers.0.mlp`` -> ``layers.0.mlp`` (Llama 4:
    ``language_model.model.layers.0.mlp`` -> ``layers.0.mlp``)."""
    return next((prefix[len(p):] for p in TEXT_PREFIXES if prefix.startswith(p)), prefix)


def keeps_float(name: str, *, include_experts: bool = False) -> str | None:
    """Why NxD Inference keeps the tensor ``name`` in float under int8 / fp8 (see the module docstring), or None.
    ``include_experts``: the experts are quantized too (the portable backend's routed-experts kernel reads int8
    experts; NxD Inference cannot load them).

    Example::

        keeps_float("model.layers.0.mlp.gate.weight")   # "a MoE router"
        keeps_float("model.layers.0.mlp.gate_proj.weight")   # None
    """
    parts = module_prefix(name).split(".")
    if name.endswith(MXFP4_SUFFIXES):
        return "MXFP4 experts (carried as they are)"
    if parts[-1] in ROUTER_NAMES:
        return "a MoE router"
    if not include_experts and any(part in EXPERT_PARTS for part in parts):
        return "MoE experts (NxDI fuses them from float weights)"
    if parts[-1] == "sinks":
        return "attention sinks"
    return None


def is_linear_weight(name: str, info: _Info, *, include_experts: bool = False) -> bool:
    """A decoder Linear weight NxDI quantizes: 2-D ``*.weight`` of a decoder layer (norms are 1-D, so they never
    match), not one NxDI keeps in float (``keeps_float``)."""
    in_layers = any(name.startswith(p + "layers.") for p in TEXT_PREFIXES)
    return (in_layers and name.endswith(".weight") and len(info.shape) == 2
            and keeps_float(name, include_experts=include_experts) is None)


def float_experts(names: Iterable[str]) -> list[str]:
    """NxDI's module names (modules_to_not_convert) of the expert weights a checkpoint holds: kept float."""
    found = {EXPERT_PARTS[part] for name in names for part in module_prefix(name).split(".")
             if part in EXPERT_PARTS and any(name.startswith(p + "layers.") for p in TEXT_PREFIXES)}
    return sorted(found)


def skip_candidates(prefix: str) -> list[str]:
    """Every name a --skip glob may match for a module: itself and its ancestors, with and without ``model.``."""
    parts = prefix.split(".")
    names = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
    return names + [nxd_module_name(n) for n in names if n.startswith("model.")]


def skip_matches(glob: str, prefix: str) -> bool:
    """True when ``glob`` names ``prefix`` or one of its ancestors, e.g. ``skip_matches("layers.0.*", ...)``."""
    return any(fnmatchcase(candidate, glob) for candidate in skip_candidates(prefix))


def check_not_quantized(infos: Mapping[str, _Info], config: Mapping[str, object], where: str) -> None:
    """Refuse a checkpoint that is already quantized (a config section, quantized dtypes, or scale tensors); gpt-oss's
    released MXFP4 experts are the exception (NxDI reads them as they are, so they are carried)."""
    fix = "quantize the original floating-point checkpoint instead"
    if _mxfp4_experts_only(infos, config):
        return
    for key in CONFIG_QUANT_KEYS:
        if config.get(key):
            raise QuantizationError(
                f"input is already quantized (config.json has a '{key}' section)", where=where, fix=fix
            )
    for name, info in infos.items():
        if info.dtype in QUANTIZED_DTYPES and len(info.shape) >= 2:
            raise QuantizationError(
                f"input is already quantized (tensor {name} is {info.dtype})", where=where, fix=fix
            )
        if name.endswith(QUANTIZED_NAME_SUFFIXES):
            raise QuantizationError(
                f"input is already quantized (it has a quantization tensor {name})", where=where, fix=fix
            )


def _mxfp4_experts_only(infos: Mapping[str, _Info], config: Mapping[str, object]) -> bool:
    """The checkpoint's only quantization is an MXFP4 config section and its ``*_blocks`` / ``*_scales`` tensors."""
    section = config.get("quantization_config")
    if not isinstance(section, dict) or section.get("quant_method") != "mxfp4":
        return False
    if any(config.get(key) for key in CONFIG_QUANT_KEYS if key != "quantization_config"):
        return False
    quantized = [n for n, i in infos.items() if i.dtype in QUANTIZED_DTYPES or n.endswith(QUANTIZED_NAME_SUFFIXES)]
    return all(n.endswith(MXFP4_SUFFIXES) for n in quantized)


def plan_quantization(
    infos: Mapping[str, _Info],
    config: Mapping[str, object],
    *,
    skip: Sequence[str] = (),
    include_lm_head: bool = False,
    include_experts: bool = False,
    where: str = "",
) -> QuantPlan:
    """Decide what to quantize; raise QuantizationError when there is nothing to quantize.

    Example::

        plan_quantization(infos, {"tie_word_embeddings": False}, skip=("*.down_proj",)).quantize
    """
    linear = [name for name, info in infos.items() if is_linear_weight(name, info, include_experts=include_experts)]
    if not linear:
        raise QuantizationError(
            f"no Linear weights to quantize (no 2-D *.weight under '{LAYERS_PREFIX}')",
            where=where,
            fix="quantize a decoder-only causal LM checkpoint in Hugging Face naming (Llama, Mistral, Qwen2/3, ...)",
        )
    for name in linear:
        if infos[name].dtype not in FLOAT_DTYPES:
            raise QuantizationError(
                f"Linear weight {name} has dtype {infos[name].dtype}, not a float type", where=where,
                fix="quantize a float32/bfloat16/float16 checkpoint",
            )
        if 0 in infos[name].shape:
            raise QuantizationError(
                f"Linear weight {name} is empty (shape {list(infos[name].shape)})", where=where,
                fix="the checkpoint is inconsistent; re-export it with save_pretrained",
            )
    lm_head_tied = LM_HEAD not in infos
    candidates = list(linear)
    if include_lm_head and not lm_head_tied:
        head = infos[LM_HEAD]
        if len(head.shape) != 2 or 0 in head.shape or head.dtype not in FLOAT_DTYPES:
            raise QuantizationError(
                f"{LM_HEAD} is {head.dtype} {list(head.shape)}, not a float [vocab, hidden] matrix to quantize",
                where=where, fix="drop --include-lm-head, or fix the checkpoint's lm_head.weight",
            )
        candidates.append(LM_HEAD)
    untie = include_lm_head and lm_head_tied and _float_matrix(infos.get(EMBED))
    if untie:
        candidates.append(LM_HEAD)  # made from EMBED (it is not in infos)
    skipped = {name for name in candidates if any(skip_matches(glob, module_prefix(name)) for glob in skip)}
    unmatched = tuple(g for g in skip if not any(skip_matches(g, module_prefix(n)) for n in candidates))
    quantize = tuple(name for name in infos if name in set(candidates) - skipped)
    untie_from = EMBED if untie and LM_HEAD not in skipped else None
    if not quantize and untie_from is None:
        raise QuantizationError(
            "every Linear weight is excluded by --skip: nothing left to quantize", where=where,
            fix="narrow the --skip globs",
        )
    lm_head_kept = not include_lm_head or (lm_head_tied and untie_from is None) or LM_HEAD in skipped
    kept = [module_prefix(n) for n in linear if n in skipped]
    if lm_head_kept:
        kept.append("lm_head")
    return QuantPlan(
        quantize=quantize,
        kept_linear=tuple(kept),
        modules_to_not_convert=tuple(modules_to_not_convert(kept, [module_prefix(n) for n in linear])
                                     + ([] if include_experts else float_experts(infos))),
        unmatched_skips=unmatched,
        lm_head_tied=lm_head_tied,
        untie_from=untie_from,
    )


def biased_projections(names: Iterable[str]) -> list[str]:
    """The attention projections (module prefixes) that have a bias, among a checkpoint's tensor names: NxD's
    quantized layers cannot take their bias (see the module docstring), so NxDI loads them only in float."""
    names = set(names)
    return sorted(p for p in (module_prefix(n) for n in names if n.endswith(".weight"))
                  if p.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj", "o_proj") and p + ".bias" in names)


def _float_matrix(info: _Info | None) -> bool:
    return info is not None and len(info.shape) == 2 and 0 not in info.shape and info.dtype in FLOAT_DTYPES


def modules_to_not_convert(kept: Iterable[str], all_linear: Iterable[str]) -> list[str]:
    """NxDI-style list: a whole ``layers.N.self_attn`` / ``layers.N.mlp`` when every Linear under it is kept,
    otherwise the single modules. Never collapse to ``layers.N``: NxDI matches partial names, and ``layers.1``
    would also match ``layers.10``.

    Example::

        modules_to_not_convert(["model.layers.0.mlp.up_proj", ...all three mlp..., "lm_head"], all_linear)
        # ["layers.0.mlp", "lm_head"]
    """
    kept = list(dict.fromkeys(kept))
    children: dict[str, set[str]] = {}
    for prefix in all_linear:
        children.setdefault(prefix.rsplit(".", 1)[0], set()).add(prefix)
    kept_set = set(kept)
    result: list[str] = []
    for prefix in kept:
        parent = prefix.rsplit(".", 1)[0] if "." in prefix else None
        if parent is not None and parent in children and children[parent] <= kept_set:
            name = nxd_module_name(parent)
        else:
            name = nxd_module_name(prefix)
        if name not in result:
            result.append(name)
    return result
