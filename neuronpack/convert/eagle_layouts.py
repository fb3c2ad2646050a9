"""Recognise an EAGLE draft's layout and plan its NxDI form from tensor headers only (torch-free, nothing read).

Two layouts exist in public (names exact, see docs/convert-eagle.md):

- ``eagle1`` (EAGLE-1 and EAGLE-2, SafeAILab/EAGLE): ``embed_tokens.weight``, ``fc.weight`` [H, 2H] (+ ``fc.bias``),
  ``layers.0.*`` without ``input_layernorm``; no ``norm``, no ``lm_head``. NxDI needs the target's head added.
- ``eagle3``: ``fc.weight`` [H, 3H], ``midlayer.*``, ``norm.weight``, its own ``lm_head.weight`` [draft_vocab, H],
  ``d2t`` / ``t2d``; no ``embed_tokens``. NxDI needs ``layers.0.*`` naming, the target's ``embed_tokens.weight`` and
  a draft vocabulary equal to the target's.

``plan_eagle_conversion`` checks every size and dtype against the target's head before a byte is written and returns
an ``EaglePlan``: the output tensors in order, each with its source and dtype. Every refusal is one
``ConversionError`` naming both values.

Example::

    plan = plan_eagle_conversion(open_checkpoint(draft_dir), open_checkpoint(target_dir), dtype="auto")
    plan.layout, [t.name for t in plan.tensors if t.source == "target"]     # ("eagle1", ["lm_head.weight"])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from neuronpack.checkpoint import dtypes as checkpoint_dtypes
from neuronpack.checkpoint.safetensors_header import TensorInfo
from neuronpack.errors import ConversionError

FLOAT_DTYPES = checkpoint_dtypes.FLOAT_CODES  # "F16" -> "float16"
FLOAT_CODES = {name: code for code, name in FLOAT_DTYPES.items()}  # "float16" -> "F16"
DTYPE_CHOICES = ("auto", "float16", "bfloat16", "float32")
HEAD = "lm_head.weight"
EMBED = "embed_tokens.weight"
INPUT_NORM = "layers.0.input_layernorm.weight"
EAGLE3_PREFIX = "midlayer."
# The targets whose draft NxD Inference builds with its Llama class, the one model class that reads the Llama-layout
# EAGLE head written here (its `fc`: models/llama/modeling_llama.py:1161). NxDI builds a draft with the target's own
# class: Qwen2/3 and the MoE classes make no `fc`, gpt-oss's draft layer is its own (sinks, MoE), Llama 4 and Mllama
# have no fused speculation (backends/nxd/families.py says which, per family; a test holds the two equal).
EAGLE_TARGETS = ("LlamaForCausalLM", "MistralForCausalLM")
# EAGLE-3 token maps: NxDI never reads them (it needs draft vocab == target vocab), so they are not written
EAGLE3_TOKEN_MAPS = ("d2t", "t2d")
# an EAGLE-3 layer's extra norm, also present after conversion (midlayer.* -> layers.0.*, d2t/t2d dropped)
EAGLE3_HIDDEN_NORM = "layers.0.hidden_norm.weight"


class CheckpointView(Protocol):
    """The part of ``neuronpack.checkpoint.Checkpoint`` planning needs (headers and config only)."""

    config: dict
    files: list[Path]

    def names(self) -> list[str]: ...

    def info(self, name: str) -> TensorInfo: ...

    def lm_head_name(self) -> str: ...


@dataclass(frozen=True)
class OutputTensor:
    """One tensor of the converted draft: its name in OUT, where it comes from, and its dtypes."""

    name: str
    source: str  # "draft" | "target"
    source_name: str  # its name in the source checkpoint
    source_dtype: str  # safetensors dtype string, e.g. "BF16"
    dtype: str  # safetensors dtype string written to OUT
    shape: tuple[int, ...]

    @property
    def cast(self) -> bool:
        return self.source_dtype != self.dtype


@dataclass(frozen=True)
class EaglePlan:
    """What convert-eagle will write, decided from headers alone."""

    layout: str  # "eagle1" | "eagle3"
    hidden_size: int
    vocab_size: int  # the target's vocabulary (rows of its head)
    out_dtype: str  # torch dtype name of every floating tensor written, e.g. "float16"
    tensors: tuple[OutputTensor, ...]
    renamed: dict[str, str] = field(default_factory=dict)
    replaces_head: bool = False  # an EAGLE-1/2 draft's own lm_head.weight is replaced (--overwrite-head)
    fc_bias: bool = False
    input_norm: bool = False  # the draft has layers.0.input_layernorm (NxDI: enable_eagle_draft_input_norm)

    @property
    def added(self) -> tuple[OutputTensor, ...]:
        return tuple(t for t in self.tensors if t.source == "target")

    @property
    def casts(self) -> tuple[OutputTensor, ...]:
        return tuple(t for t in self.tensors if t.cast)


def plan_eagle_conversion(
    draft: CheckpointView, target: CheckpointView, *, dtype: str = "auto", overwrite_head: bool = False
) -> EaglePlan:
    """Validate a draft against its target and plan the output (see the module docstring).

    ``dtype="auto"`` keeps the draft's floating dtype (that of ``fc.weight``): draft tensors are copied bit for bit and
    only the added target tensors are cast when their dtype differs. An explicit dtype casts every floating tensor
    that is not already in it; integer and bool tensors (``d2t``, ``t2d``) are never cast.

    Example::

        plan = plan_eagle_conversion(draft, target, dtype="float16")
        [(t.name, t.source_dtype, t.dtype) for t in plan.casts]    # [("lm_head.weight", "BF16", "F16")]
    """
    if dtype not in DTYPE_CHOICES:
        raise ConversionError(f"unknown --dtype {dtype!r}", fix=f"choose one of {', '.join(DTYPE_CHOICES)}")
    _check_target_architecture(target)
    names = list(draft.names())
    layout = detect_layout(names)
    fc = _require(draft, "fc.weight", "draft")
    hidden = _check_fc(draft, fc, layout)
    head_name = target.lm_head_name()
    head = target.info(head_name)
    _check_float(head, "target head", fix="point --target at the unquantized checkpoint of the target model")
    _check_matrix(head, "target head", fix="point --target at a complete causal-LM checkpoint")
    _check_float(fc, "draft", fix="point --draft at the unquantized EAGLE draft")
    vocab, target_hidden = head.shape[0], head.shape[1]
    if target_hidden != hidden:
        raise ConversionError(
            f"draft hidden size {hidden} (fc.weight {list(fc.shape)}) differs from the target's {target_hidden} "
            f"({head_name} {list(head.shape)})",
            where=f"{fc.file} vs {head.file}",
            fix="pair the draft with the target model it was trained for",
        )
    out_dtype = FLOAT_DTYPES[fc.dtype] if dtype == "auto" else dtype
    codes = _Codes(out=FLOAT_CODES[out_dtype], draft=None if dtype == "auto" else FLOAT_CODES[out_dtype])
    if layout == "eagle1":
        return _plan_eagle1(draft, target, names, head, hidden, out_dtype, codes, overwrite_head)
    return _plan_eagle3(draft, target, names, vocab, hidden, out_dtype, codes)


@dataclass(frozen=True)
class _Codes:
    """Output safetensors dtypes: ``out`` for added target tensors, ``draft`` for draft tensors (None: keep)."""

    out: str
    draft: str | None


def detect_layout(names: list[str]) -> str:
    """``"eagle3"`` when the draft has midlayer.*, d2t or t2d; ``"eagle1"`` when it has fc.weight; else refuse."""
    name_set = set(names)
    if set(EAGLE3_TOKEN_MAPS) & name_set or EAGLE3_HIDDEN_NORM in name_set \
            or any(n.startswith(EAGLE3_PREFIX) for n in names):
        return "eagle3"
    if "fc.weight" in name_set:
        return "eagle1"
    raise ConversionError(
        "not an EAGLE draft: no fc.weight, midlayer.*, d2t or t2d tensor",
        where=f"draft tensors: {', '.join(sorted(names)[:6])}{', ...' if len(names) > 6 else ''}",
        fix="point --draft at an EAGLE-1/2 or EAGLE-3 draft checkpoint (e.g. yuhuili/EAGLE-LLaMA3-Instruct-8B)",
    )


def _check_target_architecture(target: CheckpointView) -> None:
    """Refuse, by name, a target NxDI cannot speculate with an EAGLE head of this layout (EAGLE_TARGETS)."""
    archs = target.config.get("architectures") or []
    if archs and not set(archs) & set(EAGLE_TARGETS):
        raise ConversionError(
            f"NxD Inference cannot speculate with an EAGLE draft for a {archs[0]} target: it builds the draft with the "
            "target's model class, and only its Llama class (LlamaForCausalLM, MistralForCausalLM) takes the "
            "Llama-layout EAGLE head convert-eagle writes (models/llama/modeling_llama.py:1161)",
            where="--target config.json", fix='serve without speculation, or with a draft model of the same family '
                                               '(recipe [speculation] kind = "draft")')


def _plan_eagle1(draft, target, names, head, hidden, out_dtype, codes, overwrite_head) -> EaglePlan:
    vocab = head.shape[0]
    if HEAD in names and not overwrite_head:
        raise ConversionError(
            f"the EAGLE-1/2 draft already has {HEAD} {list(draft.info(HEAD).shape)}",
            where=str(draft.info(HEAD).file),
            fix="pass --overwrite-head to replace it with the target's head (the report says if they were identical)",
        )
    embed = draft.info(EMBED) if EMBED in names else None
    if embed is not None:
        _check_matrix(embed, "draft", fix="point --draft at a complete EAGLE draft checkpoint")
    if embed is not None and embed.shape[0] != vocab:
        raise ConversionError(
            f"draft vocabulary {embed.shape[0]} ({EMBED} {list(embed.shape)}) differs from the target's {vocab} "
            f"({head.name} {list(head.shape)})",
            where=f"{embed.file} vs {head.file}",
            fix="pair the draft with the target model it was trained for",
        )
    _check_config_vocab(draft.config, vocab, head)
    fc_bias = _fc_bias(draft, names)
    tensors = [_from_draft(draft.info(n), n, codes.draft) for n in names if n != HEAD]
    if embed is None:
        # Some EAGLE-2 exports drop the embedding (it equals the target's): NxDI still needs it in the draft.
        tensors.append(_target_embedding(target, vocab, hidden, codes.out))
    tensors.append(_from_target(target, head.name, HEAD, codes.out))
    return EaglePlan(
        layout="eagle1", hidden_size=hidden, vocab_size=vocab, out_dtype=out_dtype, tensors=tuple(tensors),
        replaces_head=HEAD in names, fc_bias=fc_bias, input_norm=INPUT_NORM in names,
    )


def _plan_eagle3(draft, target, names, vocab, hidden, out_dtype, codes) -> EaglePlan:
    own_head = _require(draft, HEAD, "EAGLE-3 draft")
    _check_matrix(own_head, "EAGLE-3 draft", fix="point --draft at a complete EAGLE-3 draft checkpoint")
    draft_vocab = own_head.shape[0]
    if draft_vocab != vocab:
        raise ConversionError(
            f"EAGLE-3 draft vocabulary {draft_vocab} ({HEAD} {list(own_head.shape)}, "
            f"draft_vocab_size {draft.config.get('draft_vocab_size', '?')}) differs from the target's {vocab}: "
            "NxDI requires draft_vocab_size == target vocab_size and does not apply the d2t/t2d token mapping",
            where=str(own_head.file),
            fix="use an EAGLE-3 draft trained on the full target vocabulary (draft_vocab_size = vocab_size)",
        )
    if "t2d" in names and tuple(draft.info("t2d").shape) != (vocab,):
        t2d = draft.info("t2d")
        raise ConversionError(
            f"t2d has shape {list(t2d.shape)} but the target vocabulary needs [{vocab}]",
            where=str(t2d.file),
            fix="pair the draft with the target model it was trained for",
        )
    renamed = {n: "layers.0." + n[len(EAGLE3_PREFIX):] for n in names if n.startswith(EAGLE3_PREFIX)}
    clashes = sorted(set(renamed.values()) & set(names))
    if clashes:
        raise ConversionError(
            f"the EAGLE-3 draft has both {EAGLE3_PREFIX}* and layers.0.* names for {clashes[0]}",
            where=_location(draft),
            fix="use a draft with one naming (the original midlayer.* or an already converted layers.0.*)",
        )
    tensors = [_from_draft(draft.info(n), renamed.get(n, n), codes.draft) for n in names
               if n not in EAGLE3_TOKEN_MAPS]
    if EMBED in names:
        embed = draft.info(EMBED)
        if tuple(embed.shape) != (vocab, hidden):
            raise ConversionError(
                f"draft {EMBED} {list(embed.shape)} does not match the target's [{vocab}, {hidden}]",
                where=str(embed.file),
                fix="pair the draft with the target model it was trained for",
            )
    else:
        tensors.append(_target_embedding(target, vocab, hidden, codes.out))
    out_names = [t.name for t in tensors]
    return EaglePlan(
        layout="eagle3", hidden_size=hidden, vocab_size=vocab, out_dtype=out_dtype, tensors=tuple(tensors),
        renamed=renamed, fc_bias=_fc_bias(draft, names), input_norm=INPUT_NORM in out_names,
    )


def _check_fc(draft: CheckpointView, fc: TensorInfo, layout: str) -> int:
    """fc maps concatenated hidden states to H: [H, 2H] for EAGLE-1/2, [H, 3H] for EAGLE-3. Returns H."""
    factor = 3 if layout == "eagle3" else 2
    hidden = draft.config.get("hidden_size", fc.shape[0] if len(fc.shape) == 2 else None)
    if hidden is not None and (not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1):
        raise ConversionError(
            f"draft config.json hidden_size {hidden!r} is not a positive integer",
            where=str(Path(fc.file).parent / "config.json"),
            fix="fix hidden_size in (a copy of) the draft's config.json",
        )
    if hidden is None or len(fc.shape) != 2 or tuple(fc.shape) != (hidden, factor * hidden):
        kind = "EAGLE-3 (midlayer.*, d2t or t2d present)" if layout == "eagle3" else "EAGLE-1/2"
        need = f"[H, {factor}H]" if hidden is None else f"[{hidden}, {factor * hidden}]"
        raise ConversionError(
            f"fc.weight is {list(fc.shape)} but an {kind} draft with hidden_size {hidden} needs {need}",
            where=str(fc.file),
            fix="check the draft's config.json hidden_size and that the checkpoint is a complete EAGLE draft",
        )
    return hidden


def _fc_bias(draft: CheckpointView, names: list[str]) -> bool:
    """NxDI's ``fc_bias``: whether fc.bias exists. EAGLE's config ``bias`` must agree, or NxDI would build an fc
    that does not match the weights."""
    has_bias = "fc.bias" in names
    declared = draft.config.get("bias")
    if declared is not None and bool(declared) != has_bias:
        raise ConversionError(
            f"config.json says bias={declared} but the draft {'has' if has_bias else 'has no'} fc.bias tensor",
            where=str(draft.info("fc.weight").file.parent / "config.json"),
            fix=f"set \"bias\": {str(has_bias).lower()} in the draft's config.json (a copy) or use a complete draft",
        )
    return has_bias


def _check_config_vocab(config: dict, vocab: int, head: TensorInfo) -> None:
    declared = config.get("vocab_size")
    if declared is not None and declared != vocab:
        raise ConversionError(
            f"draft config vocab_size {declared} differs from the target's {vocab} ({head.name} {list(head.shape)})",
            where=str(head.file),
            fix="pair the draft with the target model it was trained for",
        )


def _check_matrix(info: TensorInfo, what: str, *, fix: str) -> None:
    if len(info.shape) != 2:
        raise ConversionError(
            f"{what} {info.name} has shape {list(info.shape)}, not a [rows, hidden] matrix",
            where=str(info.file),
            fix=fix,
        )


def _target_embedding(target: CheckpointView, vocab: int, hidden: int, out_code: str) -> OutputTensor:
    """The target's input embedding, added to the draft; it must be [vocab, hidden] like the target's head."""
    added = _from_target(target, _target_embed_name(target), EMBED, out_code)
    if added.shape != (vocab, hidden):
        raise ConversionError(
            f"target {added.source_name} {list(added.shape)} does not match its head [{vocab}, {hidden}]",
            where=str(target.info(added.source_name).file),
            fix="point --target at a consistent Llama-family Hugging Face checkpoint",
        )
    return added


def _check_float(info: TensorInfo, what: str, *, fix: str) -> None:
    if info.dtype not in FLOAT_DTYPES:
        raise ConversionError(
            f"{what} {info.name} is {info.dtype}, not a floating-point dtype (F32, F16 or BF16) NxDI can use",
            where=str(info.file),
            fix=fix,
        )


def _require(ckpt: CheckpointView, name: str, what: str) -> TensorInfo:
    if name not in set(ckpt.names()):
        raise ConversionError(
            f"{what} has no {name} tensor",
            where=_location(ckpt),
            fix="point --draft at a complete EAGLE draft checkpoint",
        )
    return ckpt.info(name)


def _location(ckpt: CheckpointView) -> str | None:
    files = list(ckpt.files)
    return str(Path(files[0]).parent) if files else None


def _target_embed_name(target: CheckpointView) -> str:
    for name in ("model.embed_tokens.weight", EMBED):
        if name in set(target.names()):
            return name
    raise ConversionError(
        "the target has no model.embed_tokens.weight, which NxDI needs inside the draft",
        where=_location(target),
        fix="point --target at a Llama-family Hugging Face checkpoint",
    )


def _from_draft(info: TensorInfo, out_name: str, out_code: str | None) -> OutputTensor:
    """out_code None (--dtype auto) keeps the draft's bytes; d2t (I64) and t2d (BOOL) are never cast."""
    dtype = out_code if out_code and info.dtype in FLOAT_DTYPES else info.dtype
    return OutputTensor(out_name, "draft", info.name, info.dtype, dtype, tuple(info.shape))


def _from_target(target: CheckpointView, name: str, out_name: str, out_code: str) -> OutputTensor:
    info = target.info(name)
    _check_float(info, "target tensor", fix="point --target at the unquantized checkpoint of the target model")
    return OutputTensor(out_name, "target", name, info.dtype, out_code, tuple(info.shape))
