"""Which family builds a checkpoint: Hugging Face ``model_type`` (and ``architectures``) -> a module of
models/families/ (torch-free).

A family module holds one object, ``FAMILY``, with the family's differences from the others: ``config_from_hf``
(config.json -> ``ModelConfig``, torch-free), and the modules of its decoder (``decoder_layer``, ``norm``,
``embedding``; see families/llama.py, the base the others subclass). Families are found by module name, as
transformers' auto classes find theirs, so this table stays below them (a family imports models/config.py, which asks
this table) and importing it costs nothing. Adding a family is one module and one line here.

Example::

    family_for({"model_type": "qwen2", ...}).name        # "llama": Qwen2 is a Llama with q/k/v biases
    family("llama").decoder_layer(cfg, 0, frozenset())    # an nn.Module (imports torch)
"""

from __future__ import annotations

import importlib
from typing import Any

from neuronpack.errors import UnsupportedModelError

# HF model_type -> the module of neuronpack/models/families/ that builds it
FAMILIES: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
    "gemma3": "gemma3",  # Gemma3ForConditionalGeneration: its text decoder
}
# HF architectures -> family, for a config.json that names no model_type (the portable backend runs a causal LM)
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",
}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)


def family(name: str) -> Any:
    """The ``FAMILY`` object of ``models/families/<name>.py``."""
    return importlib.import_module(f"neuronpack.models.families.{name}").FAMILY


def family_for(hf: dict[str, Any]) -> Any:
    """The family of an HF config dict, by its ``model_type`` (else its first architecture); UnsupportedModelError
    naming it otherwise."""
    model_type = hf.get("model_type")
    if isinstance(model_type, str):
        name = FAMILIES.get(model_type)
    else:
        architectures = hf.get("architectures") or [None]
        name = ARCHITECTURES.get(architectures[0])
    if name is None:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported by the portable backend",
            where="config.json model_type",
            fix=f"use a {' / '.join(FAMILIES)} family checkpoint",
        )
    return family(name)
