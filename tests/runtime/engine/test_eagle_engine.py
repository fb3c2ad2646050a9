"""The engine speculating with EAGLE drafts on a real compiled artifact: greedy output equals the same artifact
without speculation, with a random EAGLE-1 draft (few drafts kept), with a draft built from the target's own layers
(most kept: the multi-token accept path) and with a random EAGLE-3 draft reading three target layers; a whole build
with ``[speculation] kind = "eagle"`` copies the draft into the artifact, compiles its graphs (AOTInductor for the
EAGLE-3 one) and serves it."""

from __future__ import annotations

import json

import pytest

from neuronpack.convert.eagle import convert_eagle
from neuronpack.runtime.engine import Engine, GenerationRequest
from neuronpack.runtime.engine.metrics import metric_value
from neuronpack.runtime.engine.sampling import SamplingParams
from neuronpack.runtime.engine.speculation.config import SpeculationConfig
from tests.convert.eagle_fixtures import draft_config, make_eagle1_draft, write_draft
from tests.runtime.serving import EXPORT, build_artifact, run_all

K = 3
GREEDY = SamplingParams(temperature=0.0)
TEXTS = ["abc abc abc abc abc abc", "The quick brown fox", "one two one two one two one", "Hello world! How are",
         "xyz xyz xyz", "1 2 3 1 2 3 1 2 3"]


@pytest.fixture(scope="module")
def random_draft(tmp_path_factory, tiny_llama):
    """A random EAGLE-1 draft in the original layout (pytorch_model.bin, no lm_head), converted for tiny_llama."""
    vocab = json.loads((tiny_llama / "config.json").read_text())["vocab_size"]
    base = tmp_path_factory.mktemp("eagle-random")
    draft = make_eagle1_draft(base / "orig", vocab=vocab, layout="bin", dtype="float32")
    convert_eagle(draft, tiny_llama, base / "converted")
    return base / "orig", base / "converted"


@pytest.fixture(scope="module")
def weak_target(tmp_path_factory, tiny_llama):
    """tiny_llama with its attention outputs scaled by 0.01: it still reads its context, barely (see copying_draft)."""
    import shutil

    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("weak") / "llama"
    shutil.copytree(tiny_llama, out)
    tensors = load_file(str(out / "model.safetensors"))
    for name in [n for n in tensors if n.endswith("self_attn.o_proj.weight")]:
        tensors[name] = tensors[name] * 0.01
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def copying_draft(tmp_path_factory, weak_target):
    """A training-free EAGLE-1 draft (original layout) that mostly agrees with weak_target: fc passes the token
    embedding through (fc = [I, 0]), its layers are the target's own (layer 0 with its input norm, which EAGLE
    allows), and the target's final norm weight is all ones, so lm_head(z) and lm_head(norm(z)) have the same argmax.
    Draft position j holds token j+1, so it misses the first token; the target's weak attention makes that matter
    rarely (some drafts are still rejected)."""
    import torch
    from safetensors.torch import load_file

    target = load_file(str(weak_target / "model.safetensors"))
    assert torch.equal(target["model.norm.weight"], torch.ones_like(target["model.norm.weight"]))
    hf = json.loads((weak_target / "config.json").read_text())
    h = hf["hidden_size"]
    tensors = {name[len("model."):]: t for name, t in target.items() if name.startswith("model.layers.")}
    tensors["embed_tokens.weight"] = target["model.embed_tokens.weight"]
    tensors["fc.weight"] = torch.cat((torch.eye(h), torch.zeros(h, h)), dim=1)
    config = {**draft_config(h, hf["vocab_size"], dtype="float32", bias=False),
              "num_hidden_layers": hf["num_hidden_layers"], "intermediate_size": hf["intermediate_size"]}
    return write_draft(tmp_path_factory.mktemp("eagle-copy") / "orig", tensors, config, layout="safetensors")


@pytest.fixture(scope="module")
def eagle_artifact(tmp_path_factory, weak_target, copying_draft):
    """weak_target built with [speculation] kind = "eagle" and the copying draft (converted by the pipeline)."""
    root = tmp_path_factory.getbasetemp() / "eagle-root"
    return build_artifact(weak_target, root, [*EXPORT, 'speculation.kind="eagle"',
                                              f'speculation.draft="{copying_draft}"', f"speculation.length={K}"])


def eagle(draft_dir) -> SpeculationConfig:
    return SpeculationConfig("eagle", K, draft_dir=draft_dir, draft_dtype="float32")


def requests(tok) -> list[GenerationRequest]:
    return [GenerationRequest(prompt_ids=tuple(tok.encode(t)), sampling=GREEDY, max_tokens=24 + 3 * i,
                              ignore_eos=True) for i, t in enumerate(TEXTS)]


def test_greedy_batch_equals_plain_decoding_with_a_random_draft(spec_lm, spec_tokenizer, random_draft):
    spec = Engine(spec_lm, spec_tokenizer, speculation=eagle(random_draft[1]))
    reqs = requests(spec_tokenizer)  # 6 requests, 4 slots: continuous batching, some wait
    expected = run_all(Engine(spec_lm, spec_tokenizer), reqs)
    assert run_all(spec, reqs) == expected
    result = spec.generate(reqs[0])
    assert result.token_ids == expected[reqs[0].request_id]
    assert result.speculation["num_draft_tokens"] > 0


def test_a_build_with_eagle_records_and_copies_the_draft(eagle_artifact):
    config = json.loads((eagle_artifact / "neuron_config.json").read_text())
    assert config["speculation"] == {"kind": "eagle", "length": K, "draft": "draft", "draft_dtype": "float32",
                                     "layout": "eagle1", "target_layers": None}
    assert {"draft_step", "draft_head"} <= set(config["graphs"])
    names = {p.name for p in (eagle_artifact / "draft").iterdir()}
    assert {"config.json", "model.safetensors", "neuronpack-eagle.json"} <= names
    manifest = json.loads((eagle_artifact / "neuronpack.json").read_text())
    assert manifest["recipe"]["speculation"]["kind"] == "eagle"


def test_a_draft_that_mostly_agrees_keeps_several_tokens_per_step(eagle_artifact):
    from neuronpack.runtime.loader import load_engine

    spec = load_engine(eagle_artifact).engine
    plain = Engine(spec.model, spec.tokenizer)  # the same loaded artifact, without speculation
    assert spec.speculation.kind == "eagle" and plain.speculation is None
    reqs = requests(spec.tokenizer)
    assert run_all(spec, reqs) == run_all(plain, reqs)  # 6 sequences drafting together (4 slots)
    text = spec.metrics.render().decode()
    accepted = metric_value(text, "neuronpack_spec_decode_num_accepted_tokens_total")
    assert accepted > 0.6 * metric_value(text, "neuronpack_spec_decode_num_draft_tokens_total")
    result = spec.generate(reqs[1])
    assert result.token_ids == plain.generate(reqs[1]).token_ids
    stats = result.speculation
    assert stats["acceptance_rate"] > 0.6  # measured ~0.9; a random draft keeps few
    assert stats["steps"] < (result.completion_tokens - 1) / 2  # several tokens per step
    sampled = GenerationRequest(prompt_ids=reqs[1].prompt_ids, max_tokens=20, ignore_eos=True,
                                sampling=SamplingParams(temperature=0.8, top_p=0.9, seed=7))
    first, second = spec.generate(sampled), spec.generate(sampled)
    assert len(first.token_ids) == 20 and first.token_ids == second.token_ids  # seeded: repeatable


def test_sequences_without_the_prompts_hidden_states_still_match(eagle_artifact):
    """A prompt-logprobs request (prefilled by prompt_logits) and the extra members of a forked request (KV copied)
    never hand the prompt's hidden states to the draft: they draft from their first verified position on."""
    from neuronpack.runtime.loader import load_engine

    spec = load_engine(eagle_artifact).engine
    plain = Engine(spec.model, spec.tokenizer)
    ids = tuple(spec.tokenizer.encode(TEXTS[2]))
    scored = GenerationRequest(prompt_ids=ids, sampling=GREEDY, max_tokens=16, ignore_eos=True, prompt_logprobs=1)
    result = spec.generate(scored)
    assert result.token_ids == plain.generate(scored).token_ids
    assert result.speculation["num_accepted_tokens"] > 0

    def forks(engine):
        members = [GenerationRequest(prompt_ids=ids, sampling=GREEDY, max_tokens=16, ignore_eos=True)
                   for _ in range(3)]
        outputs = {m.request_id: [] for m in members}
        engine.submit_forks(members, [lambda out, rid=m.request_id: outputs[rid].extend(out.token_ids)
                                      for m in members])
        while engine.step():
            pass
        return list(outputs.values())

    expected = forks(plain)
    assert forks(spec) == expected and expected[0] == expected[1] == expected[2]


def test_eagle_reuses_no_prefix_and_chunks_long_prompts(eagle_artifact):
    """An EAGLE engine keeps prefix caching off (its draft's KV of a prompt comes from the target's hidden states of
    that prompt, which a cache hit does not compute), and a prompt longer than the largest context bucket is
    prefilled in chunks whose hidden states reach the draft as one prompt's: tokens as without speculation."""
    from neuronpack.runtime.loader import load_engine

    spec = load_engine(eagle_artifact).engine
    plain = Engine(spec.model, spec.tokenizer)
    assert not spec.scheduler.prefix_caching and "EAGLE" in spec.prefix_caching_off_reason
    ids = tuple(spec.tokenizer.encode(" ".join([TEXTS[2]] * 4)))
    assert 64 < len(ids) < 110
    request = GenerationRequest(prompt_ids=ids, sampling=GREEDY, max_tokens=16, ignore_eos=True)
    result = spec.generate(request)
    assert result.token_ids == plain.generate(request).token_ids
    assert result.speculation["num_accepted_tokens"] > 0


def test_generate_json_reports_eagle_speculation(eagle_artifact):
    from typer.testing import CliRunner

    from neuronpack.cli.app import app

    runner = CliRunner()
    args = ["generate", str(eagle_artifact), "--prompt", TEXTS[0], "--max-tokens", "16", "--format", "json"]
    on, off = runner.invoke(app, args), runner.invoke(app, [*args, "--no-speculation"])
    assert on.exit_code == 0 and off.exit_code == 0, on.output + off.output
    a, b = json.loads(on.stdout), json.loads(off.stdout)
    assert a["tokens"] == b["tokens"] and "speculation" not in b
    assert a["speculation"]["kind"] == "eagle" and a["speculation"]["num_accepted_tokens"] > 0


# -- EAGLE-3, compiled with AOTInductor ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def eagle3_artifact(tmp_path_factory):
    """A 3-layer tiny Llama built with AOTInductor and a random EAGLE-3 draft in its original layout (midlayer.*,
    d2t / t2d; reading the inputs of target layers 0, 1 and 2), converted by the pipeline."""
    from tests.convert.eagle_fixtures import make_eagle3_draft
    from tests.helpers.tiny_models import make_tiny_checkpoint

    base = tmp_path_factory.mktemp("eagle3")
    target = make_tiny_checkpoint(base / "target", layers=3)
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    draft = make_eagle3_draft(base / "draft", vocab=vocab, dtype="float32", aux_layers=[0, 1, 2])
    return build_artifact(target, base / "root", ["compiler=aoti", 'speculation.kind="eagle"',
                                                  f'speculation.draft="{draft}"', f"speculation.length={K}"])


@pytest.mark.slow
def test_eagle3_on_compiled_draft_graphs_keeps_greedy_output(eagle3_artifact):
    from neuronpack.runtime.loader import load_engine

    config = json.loads((eagle3_artifact / "neuron_config.json").read_text())
    assert config["compiler"] == "aoti" and {"draft_step", "draft_head"} <= set(config["graphs"])
    assert config["speculation"]["layout"] == "eagle3" and config["speculation"]["target_layers"] == [0, 1, 2]
    spec = load_engine(eagle3_artifact).engine
    proposer = spec.speculator.proposer
    assert proposer.hidden_layers == (0, 1, 2) and proposer._core is not None  # the compiled draft graphs run
    if config["linear_kernels"]:  # their linears call neuronpack's kernels, as the target's graphs do
        assert proposer.draft.fc.kernel and proposer.draft.lm_head.kernel
    plain = Engine(spec.model, spec.tokenizer)
    reqs = requests(spec.tokenizer)
    assert run_all(spec, reqs) == run_all(plain, reqs)
    result = spec.generate(reqs[0])
    assert result.token_ids == plain.generate(reqs[0]).token_ids
    assert result.speculation["num_draft_tokens"] > 0
