"""A LoRA adapter and a grammar on the same request, over HTTP with the openai client: `model` picks the adapter,
`response_format` a JSON Schema. Greedy output equals transformers + PEFT merged decoding under the same grammar
mask (so both the adapter and the mask shaped every token); sampled outputs, mixed with the base model and another
adapter in the same decode steps, all validate against the schema (jsonschema)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from neuronpack.runtime.engine import Engine
from neuronpack.runtime.structured import Constraint, GrammarSpec, mask_logits
from tests.helpers.lora_adapters import merged_reference

pytestmark = pytest.mark.slow  # the shared LoRA artifact (tests/conftest.py) is an AOTInductor build
BASE = "tiny"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "count": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "count"], "additionalProperties": False}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA}}
MESSAGES = [{"role": "user", "content": "An item?"}]


def _constrained_greedy(model, engine: Engine, prompt: list[int], max_new: int) -> list[int]:
    """Greedy decoding by transformers with the engine's own grammar mask on every step, until the grammar is
    complete or EOS (not included)."""
    import torch

    grammar = engine.grammars.compile(GrammarSpec.json_schema(SCHEMA, param="response_format"))
    constraint = Constraint(grammar.new_matcher(), engine.model.vocab_size)
    ids, eos = list(prompt), engine.tokenizer.eos_token_id
    with torch.no_grad():
        for _ in range(max_new):
            logits = model(torch.tensor([ids])).logits[0, -1:].float()  # [1, vocab]
            token = int(mask_logits(logits, [constraint])[0].argmax())
            if token == eos:
                break
            assert constraint.consume(token)
            ids.append(token)
            if constraint.done:
                break
    return ids[len(prompt):]


def test_greedy_with_an_adapter_and_a_schema_equals_peft_merged_under_the_same_mask(lora_client, lora_live,
                                                                                    lora_artifact,
                                                                                    tiny_llama):
    engine = lora_live.engine
    prompt = engine.tokenizer.encode_chat(MESSAGES)
    texts = {}
    for model, adapter in ((BASE, None), ("sql", lora_artifact[1]["sql"])):
        out = lora_client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=40, temperature=0,
                                             response_format=RESPONSE_FORMAT)
        choice = out.choices[0]
        assert choice.finish_reason == "stop" and out.model == model
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
        expected = _constrained_greedy(merged_reference(tiny_llama, adapter), engine, prompt, 40)
        assert json.loads(choice.message.content) == json.loads(engine.tokenizer.decode(expected)), model
        texts[model] = choice.message.content
    assert texts[BASE] != texts["sql"]  # the adapter changed the constrained answer: it was applied


def test_sampled_schema_requests_on_adapters_and_base_in_the_same_steps_all_validate(lora_client):
    def ask(model: str, seed: int) -> list[tuple[str, str | None]]:
        out = lora_client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=40, temperature=1.0,
                                             seed=seed, n=2, response_format=RESPONSE_FORMAT)
        return [(c.message.content, c.finish_reason) for c in out.choices]

    with ThreadPoolExecutor(6) as pool:  # in flight together: one decode step mixes adapters and grammars
        answers = list(pool.map(ask, [BASE, "sql", "chat"] * 2, range(6)))
    for choices in answers:
        for content, finish in choices:
            assert finish == "stop", content
            jsonschema.validate(json.loads(content), SCHEMA)
    streamed = lora_client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=40, temperature=1.0,
                                              seed=7, stream=True, response_format=RESPONSE_FORMAT)
    jsonschema.validate(json.loads("".join(c.choices[0].delta.content or "" for c in streamed if c.choices)), SCHEMA)
