"""The checkpoint an artifact is scored against, and the model transformers makes of it.

Which checkpoint (``resolve_reference``):

- ``--reference DIR`` when given;
- else the checkpoint the artifact was compiled from, as given (the manifest's ``model.original_path``: for a recipe
  with ``[quantization]``, the float checkpoint before the build quantized it);
- that checkpoint made by ``neuronpack quantize`` (config.json's ``quantization`` section): the checkpoint it was
  quantized from, which ``neuronpack-quantize.json`` records, when it is still there unchanged (the figures then
  hold the quantization error, as a recipe-quantized artifact's do); else the quantized checkpoint itself,
  dequantized. transformers alone reads such a checkpoint wrongly: it loads the int8 / fp8 values as floats and
  drops every ``.scale`` (top-1 agreement 0.002 on a correct artifact).

How transformers reads it (``load_reference``): float32; a neuronpack-quantized checkpoint (given, or the fallback
above) with each quantized weight replaced by its stored values x their float32 scale; a checkpoint whose config
ties the head but which stores another ``lm_head.weight`` is refused as compile refuses it
(checkpoint/tied_head.py), since transformers would score against the stored head and the artifact never had it.

Example::

    reference = resolve_reference(Path("/models/llama-int8"), given=False)
    reference.path, reference.dequantized      # (Path("/models/llama"), False) while the source is unchanged
    model = load_reference(reference, vocab_size=49152)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from neuronpack.errors import AccuracyError

QUANTIZATION_SECTION = "quantization"  # neuronpack quantize's section of config.json (convert/quantize.py)


@dataclass(frozen=True)
class Reference:
    path: Path | None  # the checkpoint transformers loads
    dequantized: bool = False  # its neuronpack-quantized weights are dequantized into the model
    quantized_from: Path | None = None  # the quantized checkpoint whose recorded source ``path`` is

    def describe(self) -> str:
        if self.dequantized:
            return f"{self.path} (dequantized)"
        return f"{self.path} (quantized into {self.quantized_from})" if self.quantized_from else str(self.path)


def resolve_reference(source: Path | None, *, given: bool) -> Reference:
    """The reference for an artifact compiled from ``source`` (``given``: the user named it; then it is used as it
    is, dequantized when neuronpack quantized it). See the module docstring for the rule."""
    if source is None or not quantized_by_neuronpack(Path(source)):
        return Reference(None if source is None else Path(source))
    if not given:
        from neuronpack.convert.quantize import recorded_source

        original = recorded_source(Path(source))
        if original is not None:
            return Reference(original, quantized_from=Path(source))
    return Reference(Path(source), dequantized=True)


def quantized_by_neuronpack(checkpoint: Path) -> bool:
    """Whether ``checkpoint``'s config.json has neuronpack quantize's section (int8 / fp8 values + scales)."""
    try:
        config = json.loads((Path(checkpoint) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get(QUANTIZATION_SECTION), dict)


def load_reference(reference: Reference, vocab_size: int):
    """The float32 transformers model of ``reference``; AccuracyError when it is missing, holds another vocabulary,
    or ties its head while storing another one."""
    import torch
    import transformers

    from neuronpack.checkpoint import open_checkpoint
    from neuronpack.checkpoint.tied_head import check_tied_head

    ref = reference.path
    if ref is None or not (ref / "config.json").is_file():
        raise AccuracyError("the reference checkpoint is not there", where=str(ref),
                            fix="pass --reference DIR (the Hugging Face checkpoint the artifact was compiled from)")
    check_tied_head(open_checkpoint(ref))
    # .float(): transformers dequantizes an MXFP4 checkpoint (gpt-oss) to bfloat16 whatever dtype is asked
    model = _quiet_from_pretrained(transformers, ref, dtype=torch.float32).float().eval()
    if reference.dequantized:
        model = dequantize_into(model, ref)
    if model.config.vocab_size != vocab_size:
        raise AccuracyError(f"reference vocabulary {model.config.vocab_size} differs from the artifact's "
                            f"{vocab_size}", where=str(ref), fix="pass the checkpoint the artifact was compiled from")
    return model


def dequantize_into(model, quantized_dir: Path | str):
    """``model`` (a float transformers model of the quantized checkpoint's architecture) holding the checkpoint's
    weights dequantized: stored int8 / fp8 values x their float32 scale, every other tensor as stored; what a correct
    quantized load must reproduce. A head the quantizer untied (``--include-lm-head`` on a tied model) is untied in
    the model too; Llama 4's ``language_model.*`` names land on the text model's, and a quantized weight that would
    land nowhere is refused. Returns ``model``."""
    import torch
    from safetensors import safe_open

    from neuronpack.convert.quant_math import dequantize

    weights = {}
    for shard in sorted(Path(quantized_dir).glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            weights.update({name: f.get_tensor(name) for name in f.keys()})
    head = model.get_output_embeddings()
    if "lm_head.weight" in weights and head.weight is model.get_input_embeddings().weight:
        head.weight = torch.nn.Parameter(head.weight.detach().clone())
        model.config.tie_word_embeddings = False
    own = model.state_dict()
    state = {}
    for name, value in weights.items():
        if name.endswith(".scale"):
            continue
        scale = weights.get(name[: -len("weight")] + "scale") if name.endswith(".weight") else None
        # Llama 4 stores its text model under language_model.*; transformers' text model has the names without it
        target = name if name in own or not name.startswith("language_model.") else name[len("language_model."):]
        if scale is not None and target not in own:
            raise AccuracyError(f"the reference model has no {target} for the quantized {name}", where=str(
                quantized_dir), fix="score the quantized checkpoint against the model it was quantized from")
        state[target] = dequantize(value, scale) if scale is not None else value.float()
    model.load_state_dict(state, strict=False)
    return model


def _quiet_from_pretrained(transformers, ref, **kwargs):
    """The reference model, loaded without transformers' own "Loading weights" bar: progress is the reporter's (a
    tqdm bar in an eval log, or between the reporter's lines, is noise a reader cannot turn off)."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(ref, **kwargs)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
