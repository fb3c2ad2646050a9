"""Which model names a server answers to, as vLLM does with ``--lora-modules``: the base model under its served
name(s), and each LoRA adapter of the artifact under its own name. A request's ``model`` picks the adapter.

``/v1/models`` lists the base model first, then one card per adapter with vLLM's fields (``root`` the adapter's
directory, ``parent`` the base model's name); an unknown name is vLLM's 404 ("The model `x` does not exist.").

Example::

    served = ServedModels(["smollm2"], ("sql",), roots={"sql": "/art/lora/sql"})
    served.adapter_slot("sql")      # 1: the engine's adapter index (0 = the base model)
    served.adapter_slot("smollm2")  # 0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from neuronpack.errors import ServeError


@dataclass(frozen=True)
class ServedModels:
    """Base model names and adapter names (in slot order: adapter k has slot k+1)."""

    base_names: Sequence[str]
    adapter_names: Sequence[str] = ()
    roots: Mapping[str, str] = field(default_factory=dict)  # name -> where it comes from (``root`` in /v1/models)

    def __post_init__(self) -> None:
        clash = set(self.base_names) & set(self.adapter_names)
        if clash:
            raise ServeError(f"LoRA adapter {sorted(clash)[0]!r} has the served model's name: a request could not "
                             "say which it means", where="--served-model-name",
                             fix="pass another --served-model-name (or rename the adapter in the recipe)")

    @property
    def names(self) -> list[str]:
        return [*self.base_names, *self.adapter_names]

    def adapter_slot(self, model: str) -> int | None:
        """The engine's adapter index for a request's ``model``: 0 for the base model, k+1 for adapter k, None for
        a name this server does not serve (the server answers 404)."""
        if model in self.base_names:
            return 0
        if model in self.adapter_names:
            return list(self.adapter_names).index(model) + 1
        return None

    def cards(self, *, created: int, max_model_len: int | None, base_info: Mapping[str, Any] | None = None
              ) -> list[dict[str, Any]]:
        """``/v1/models`` data: base model cards, then adapter cards (vLLM's ModelCard fields)."""
        base = [{"id": name, "object": "model", "created": created, "owned_by": "neuronpack", "root": name,
                 "parent": None, "max_model_len": max_model_len, **(base_info or {})} for name in self.base_names]
        adapters = [{"id": name, "object": "model", "created": created, "owned_by": "neuronpack",
                     "root": self.roots.get(name, name), "parent": self.base_names[0], "max_model_len": None}
                    for name in self.adapter_names]
        return base + adapters
