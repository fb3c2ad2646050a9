"""Served names -> adapter slots, and the /v1/models cards in vLLM's shape (no model needed)."""

import pytest

from neuronpack.errors import ServeError
from neuronpack.runtime.adapters import ServedModels


def test_names_map_to_slots_and_cards_follow_vllm():
    served = ServedModels(["base"], ("sql", "chat"), roots={"sql": "/art/lora/sql"})
    assert [served.adapter_slot(n) for n in ("base", "sql", "chat", "nope")] == [0, 1, 2, None]
    cards = served.cards(created=1, max_model_len=128, base_info={"root": "/art"})
    assert [c["id"] for c in cards] == ["base", "sql", "chat"]
    assert cards[0]["root"] == "/art" and cards[0]["parent"] is None and cards[0]["max_model_len"] == 128
    assert cards[1] | {"created": 0} == {"id": "sql", "object": "model", "created": 0, "owned_by": "neuronpack",
                                         "root": "/art/lora/sql", "parent": "base", "max_model_len": None}
    assert cards[2]["root"] == "chat"  # no root given: its name, like vLLM's fallback


def test_an_adapter_named_like_the_model_is_refused():
    with pytest.raises(ServeError, match="has the served model's name") as err:
        ServedModels(["sql"], ("sql",))
    assert "--served-model-name" in err.value.fix
