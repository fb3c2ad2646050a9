"""LoRA adapters served like vLLM's --lora-modules: /v1/models lists them, a request's `model` picks one (greedy
output equals transformers + PEFT merged), requests for different adapters share decode steps, an unknown name is a
404; `neuronpack generate --lora NAME`."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from typer.testing import CliRunner

from neuronpack.cli.app import app
from neuronpack.runtime.tokenizer import ArtifactTokenizer
from tests.helpers.lora_adapters import greedy_reference, merged_reference

pytestmark = pytest.mark.slow
BASE = "tiny"
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def references(lora_artifact, tiny_llama):
    adapters = lora_artifact[1]
    return {BASE: merged_reference(tiny_llama, None), "sql": merged_reference(tiny_llama, adapters["sql"]),
            "chat": merged_reference(tiny_llama, adapters["chat"])}


def test_models_lists_the_base_model_and_each_adapter_like_vllm(lora_client, lora_artifact):
    cards = {m.id: m for m in lora_client.models.list().data}
    assert list(cards) == [BASE, "sql", "chat"]
    assert cards["sql"].parent == BASE and cards["sql"].root == str(lora_artifact[0] / "lora" / "sql")
    assert cards[BASE].parent is None and cards[BASE].max_model_len == 128


def test_each_model_name_is_its_adapter_and_concurrent_requests_mix(lora_client, lora_live, references):
    tok = lora_live.engine.tokenizer
    ids = tok.encode(PROMPT)

    def ask(model: str) -> tuple[str, str]:
        out = lora_client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
        return model, out.choices[0].text

    with ThreadPoolExecutor(6) as pool:  # in flight together: one decode step serves several adapters
        answers = list(pool.map(ask, [BASE, "sql", "chat"] * 2))
    for model, text in answers:
        assert text == tok.decode(greedy_reference(references[model], ids, 12, tok.eos_token_id)), model
    assert len({text for _model, text in answers}) == 3


def test_chat_completion_with_an_adapter(lora_client, lora_live, references):
    tok = lora_live.engine.tokenizer
    messages = [{"role": "user", "content": "Hello world! How are you today?"}]
    out = lora_client.chat.completions.create(model="chat", messages=messages, max_tokens=10, temperature=0)
    expected = greedy_reference(references["chat"], tok.encode_chat(messages), 10, tok.eos_token_id)
    assert out.choices[0].message.content == tok.decode(expected) and out.model == "chat"


def test_an_unknown_model_is_a_404(lora_client):
    with pytest.raises(openai.NotFoundError) as err:
        lora_client.completions.create(model="nope", prompt=PROMPT, max_tokens=2)
    assert "The model `nope` does not exist" in err.value.message and "sql" in err.value.message


def test_generate_lora_flag(lora_artifact, references):
    art = lora_artifact[0]
    tok = ArtifactTokenizer.from_dir(art)
    runner = CliRunner()
    result = runner.invoke(app, ["generate", str(art), "--prompt", PROMPT, "--max-tokens", "8", "--lora", "sql",
                                 "--threads", "1", "--quiet", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["tokens"] == greedy_reference(references["sql"], tok.encode(PROMPT), 8, tok.eos_token_id)
    assert data["model"] == "sql"
    bad = runner.invoke(app, ["generate", str(art), "--prompt", PROMPT, "--lora", "nope"])
    assert bad.exit_code == 1 and "no LoRA adapter 'nope'" in bad.output and "sql, chat" in bad.output
    assert "load weights" not in bad.output  # refused from the manifest, before the model is loaded


def test_inspect_lists_the_adapters(lora_artifact):
    result = CliRunner().invoke(app, ["inspect", str(lora_artifact[0]), "--format", "json"])
    assert result.exit_code == 0, result.output
    manifest = json.loads(result.stdout)
    assert [m["name"] for m in manifest["serve"]["lora_modules"]] == ["sql", "chat"]
    text = CliRunner().invoke(app, ["inspect", str(lora_artifact[0])], terminal_width=200)
    assert "sql (lora/sql)" in text.output and "max_loras 2" in text.output
