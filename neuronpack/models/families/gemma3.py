"""Gemma 3 text (``Gemma3ForCausalLM``, and the text decoder of ``Gemma3ForConditionalGeneration`` checkpoints):
Gemma 2 (families/gemma2.py) with

- every 6th layer global (``sliding_window_pattern``), each attention kind with its own rope:
  ``rope_parameters[kind]`` (transformers 5), or ``rope_local_base_freq`` for the sliding layers and ``rope_theta``
  + ``rope_scaling`` for the global ones (transformers 4);
- q / k norms ((1 + w) RMSNorm over head_dim) before rope;
- no attention soft-capping: transformers 5.25 and vLLM both leave ``attn_logit_softcapping`` unused in Gemma 3
  (null in every released config); the final logits are capped when ``final_logit_softcapping`` is set.

A ``Gemma3ForConditionalGeneration`` checkpoint's text decoder is read under its own names
(``language_model.model.*``, or ``model.language_model.*``); its vision tower and projector are not loaded, and the
loader says so by name (``left_out``): the portable backend serves text.

Example::

    cfg = FAMILY.config_from_hf(hf)                    # a gemma3_text config.json, or a gemma3 one (text_config)
    cfg.layer_kind(5), cfg.rope_for("sliding_attention")["rope_theta"]   # ("full_attention", 10000.0)
"""

from __future__ import annotations

from typing import Any

from neuronpack.errors import UnsupportedModelError
from neuronpack.models.config import FULL, SLIDING, ModelConfig, rope_parameters
from neuronpack.models.families.gemma2 import Gemma2Family

TEXT_PREFIXES = ("language_model.model.", "model.language_model.")  # a multimodal checkpoint's text decoder
HEAD_PREFIXES = ("language_model.lm_head.",)
VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")
DEFAULT_THETA = {FULL: 1_000_000.0, SLIDING: 10_000.0}


class Gemma3Family(Gemma2Family):
    name = "gemma3"
    pattern = 6
    caps = {"final_logit_softcapping": None}
    attention_cap = None  # as transformers' and vLLM's Gemma 3: the config's attention cap is not applied

    def ropes(self, text: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        return _rope(text, FULL), _rope(text, SLIDING)

    def attention(self, cfg: ModelConfig, index: int, int8: frozenset[str]):
        from neuronpack.models.attention import Attention

        return Attention(cfg, int8, f"model.layers.{index}.self_attn", window=cfg.window(cfg.layer_kind(index)),
                         qk_norm=lambda dim: self.norm(cfg, dim))

    def text_config(self, hf: dict[str, Any]) -> dict[str, Any]:
        """A gemma3_text config itself, or a multimodal config's ``text_config`` as a ``Gemma3ForCausalLM``
        config.json (what the artifact's ``weights/`` holds)."""
        if hf.get("model_type") != "gemma3":
            return hf
        text = dict(hf.get("text_config") or {})
        if not text:
            raise UnsupportedModelError("a gemma3 config.json without text_config", where="config.json text_config",
                                        fix="use a Gemma 3 checkpoint's own config.json")
        for key in ("tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype"):
            if key in hf:
                text.setdefault(key, hf[key])
        return {**text, "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"]}

    def checkpoint_names(self, names: set[str]) -> dict[str, str]:
        """Our tensor name -> the checkpoint's, for a multimodal checkpoint's text decoder (else {})."""
        out = {}
        for name in names:
            text = next((p for p in TEXT_PREFIXES if name.startswith(p)), None)
            if text is not None:
                out["model." + name[len(text):]] = name
            elif name.startswith(HEAD_PREFIXES):
                out["lm_head." + name.split(".lm_head.", 1)[1]] = name
        return out

    def left_out(self, names: set[str]) -> str | None:
        vision = [p.rstrip(".") for p in VISION_PREFIXES if any(n.startswith(p) for n in names)]
        if not vision:
            return None
        return (f"{', '.join(vision)} (the vision tower) are not loaded: the portable backend runs Gemma 3's text "
                "decoder, image inputs are not supported")


def _rope(text: dict[str, Any], kind: str) -> dict[str, Any]:
    """One kind's rope: transformers 5's ``rope_parameters[kind]``, else 4's spelling (the global layers take
    ``rope_theta`` and ``rope_scaling``, the sliding ones ``rope_local_base_freq``, unscaled)."""
    per_kind = text.get("rope_parameters") or {}
    if isinstance(per_kind.get(kind), dict):
        return rope_parameters({"rope_theta": DEFAULT_THETA[kind]}, dict(per_kind[kind]))
    if kind == SLIDING:
        return rope_parameters({}, {"rope_theta": text.get("rope_local_base_freq", DEFAULT_THETA[SLIDING])})
    params = dict(text.get("rope_scaling") or {})
    return rope_parameters({}, {**params, "rope_theta": text.get("rope_theta", DEFAULT_THETA[FULL])})


FAMILY = Gemma3Family()
