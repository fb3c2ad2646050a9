"""TorchAotBackend.build / load_artifact on tiny checkpoints with the export-only compiler (fast): artifact layout,
neuron_config.json, one weights copy, recipe refusals and clear load-time errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from neuronpack.backends.torch_aot import TorchAotBackend, load_artifact
from neuronpack.checkpoint import open_checkpoint
from neuronpack.errors import ArtifactError, BucketError, RecipeError
from neuronpack.models import load_model
from neuronpack.runtime.engine.kv_rows import BlockCopy, BlockExchange, RowSwap
from tests.backends.torch_aot.build_requests import tiny_request


@pytest.fixture(scope="module")
def smollm_export(tmp_path_factory):
    """A bf16 export-only artifact of a tiny tied SmolLM (built once for this module)."""
    from tests.helpers.tiny_models import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("torch-export")
    model_dir = make_tiny_checkpoint(root / "smollm", arch="smollm")
    request = tiny_request(model_dir, root / "artifact", model={"dtype": "bfloat16"})
    info = TorchAotBackend().build(request)
    return model_dir, request.staging, info


def test_artifact_layout(smollm_export):
    model_dir, artifact, info = smollm_export
    names = {str(p.relative_to(artifact)) for p in artifact.rglob("*")}
    assert {"graphs.pt2", "neuron_config.json", "config.json", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", "chat_template.jinja", "weights/model.safetensors",
            "weights/config.json"} <= names
    assert "neuronpack.json" not in names  # the pipeline writes the manifest
    assert info["compiler"] == "export"
    assert set(info["bucket_seconds"]) == {"layer_decode", "layer_step", "head"}  # one layer kind: 3 graphs


def test_neuron_config_fields(smollm_export):
    _, artifact, _ = smollm_export
    config = json.loads((artifact / "neuron_config.json").read_text())
    assert config["batch_size"] == config["tkg_batch_size"] == 2 and config["ctx_batch_size"] == 1
    assert (config["seq_len"], config["max_context_length"], config["tp_degree"]) == (128, 64, 1)
    assert config["context_encoding_buckets"] == [16, 64]
    assert config["token_generation_buckets"] == [64, 128]
    assert config["torch_dtype"] == "bfloat16" and config["compiler"] == "export"
    assert config["graphs"] == {n: n for n in ("layer_decode", "layer_step", "head")}
    assert config["layer_graphs"] == [0] * config["num_layers"]
    assert config["target"]["torch"] == torch.__version__


def test_weights_are_one_copy_in_recipe_dtype(smollm_export):
    model_dir, artifact, _ = smollm_export
    weights = open_checkpoint(artifact / "weights")
    source = open_checkpoint(model_dir)
    assert "lm_head.weight" not in weights.names() and weights.tied  # tied: stored once
    assert sorted(weights.names()) == sorted(source.names())
    assert {weights.info(n).dtype for n in weights.names()} == {"BF16"}
    torch.testing.assert_close(weights.get("model.norm.weight"), source.get("model.norm.weight").bfloat16())


def test_loaded_artifact_matches_the_model(smollm_export):
    model_dir, artifact, _ = smollm_export
    lm = load_artifact(artifact)
    assert (lm.batch_size, lm.context_buckets, lm.token_generation_buckets) == (2, (16, 64), (64, 128))
    assert (lm.max_seq_len, lm.vocab_size, lm.eos_token_ids) == (128, 384, (2,))
    reference = load_model(model_dir, torch.bfloat16)
    prompt = list(range(3, 23))
    full = reference.forward_full(torch.tensor([prompt + [9]]))[0]
    logits = lm.prefill([1], [prompt])
    assert logits.dtype == torch.float32 and logits.shape == (1, 384)
    torch.testing.assert_close(logits[0], full[19], atol=5e-2, rtol=2e-2)
    step = lm.decode(torch.tensor([0, 9]), torch.tensor([0, 20]))
    torch.testing.assert_close(step[1], full[20], atol=5e-2, rtol=2e-2)
    lm.prefill([1], [prompt])  # rewrites slot 1's positions 0..19
    alone = lm.decode(torch.tensor([9]), torch.tensor([20]), slots=[1])  # slot 1 alone: a batch-1 step
    assert alone.shape == (1, 384)
    torch.testing.assert_close(alone[0], full[20], atol=5e-2, rtol=2e-2)


def test_prompt_logits_score_every_position(smollm_export):
    model_dir, artifact, _ = smollm_export
    lm = load_artifact(artifact)
    reference = load_model(model_dir, torch.bfloat16)
    prompt = list(range(3, 23))
    full = reference.forward_full(torch.tensor([prompt + [9]]))[0]
    every = lm.prompt_logits(prompt, slot=1)
    assert every.dtype == torch.float32 and every.shape == (20, 384)
    torch.testing.assert_close(every, full[:20], atol=5e-2, rtol=2e-2)
    torch.testing.assert_close(every[-1], lm.prefill([0], [prompt])[0], atol=1e-2, rtol=1e-2)
    step = lm.decode(torch.tensor([0, 9]), torch.tensor([0, 20]))  # the prompt's KV is in slot 1
    torch.testing.assert_close(step[1], full[20], atol=5e-2, rtol=2e-2)
    with pytest.raises(BucketError, match="largest context bucket 64"):
        lm.prompt_logits([1] * 65)


def test_prefill_from_a_start_position_and_kv_moves(smollm_export):
    """``starts``: a prompt's tail prefilled after its head (prefix caching, chunks of a long prompt) is the whole
    prompt's prefill; prompt logits too; the prefix pool's blocks and row swaps move KV without changing it."""
    model_dir, artifact, _ = smollm_export
    lm = load_artifact(artifact)
    reference = load_model(model_dir, torch.bfloat16)
    prompt = list(range(3, 103))  # 100 tokens: longer than the largest context bucket (64)
    full = reference.forward_full(torch.tensor([prompt]))[0]
    lm.reserve_blocks(8, 16)
    assert lm.kv_row_bytes == 2 * lm.num_layers * lm._cache.k[0, 0].numel() * 2
    assert lm.kv_token_bytes * lm._cache.k.shape[3] == lm.kv_row_bytes
    lm.prefill([0], [prompt[:60]])
    lm.move_kv([BlockCopy(0, (0, 1, 2), (5, 2, 7), True)])  # positions 0..47 into pool blocks 5, 2, 7
    lm.move_kv([RowSwap(0, 1, 60, 0)])  # row 0's 60 positions into row 1 (row 0 held nothing more)
    for cache in (lm._cache.k, lm._cache.v):
        cache[:, 1, :, :48] = 0  # lost: the pool's blocks bring them back
    lm.move_kv([BlockCopy(1, (0, 1, 2), (5, 2, 7), False)])
    head_and_tail = lm.prefill([1], [prompt[60:]], starts=[60])
    torch.testing.assert_close(head_and_tail[0], full[-1], atol=5e-2, rtol=2e-2)
    every = torch.cat([lm.prompt_logits(prompt[:64], slot=0), lm.prompt_logits(prompt[64:], slot=0, start=64)])
    torch.testing.assert_close(every, full, atol=5e-2, rtol=2e-2)
    step = lm.decode(torch.tensor([9, 9]), torch.tensor([100, 100]))  # both rows hold the prompt's KV
    after = reference.forward_full(torch.tensor([[*prompt, 9]]))[0, -1]
    torch.testing.assert_close(step, after.expand(2, -1), atol=5e-2, rtol=2e-2)
    with pytest.raises(BucketError, match="passes the compiled sequence length"):
        lm.prefill([0], [[1] * 30], starts=[100])


def test_a_block_exchange_reads_both_sources_before_writing(smollm_export):
    """A pool hit's exchange (runtime/engine/kv_rows.py): the row's prefix is saved into the very blocks the pool's
    prefix comes in from, and both arrive whole."""
    model_dir, artifact, _ = smollm_export
    lm = load_artifact(artifact)
    reference = load_model(model_dir, torch.bfloat16)
    a, b = list(range(3, 63)), list(range(200, 260))
    lm.reserve_blocks(4, 16)
    lm.prefill([0], [a[:48]])
    lm.prefill([1], [b[:48]])
    lm.move_kv([BlockCopy(1, (0, 1, 2), (1, 2, 3), True)])  # b's 3 blocks into the pool
    lm.move_kv([BlockExchange(BlockCopy(0, (0, 1, 2), (3, 1, 2), True), BlockCopy(0, (0, 1, 2), (1, 2, 3), False))])
    lm.move_kv([BlockCopy(1, (0, 1, 2), (3, 1, 2), False)])  # a's blocks, saved by the exchange, into row 1
    for row, tokens in ((0, b), (1, a)):
        tail = lm.prefill([row], [tokens[48:]], starts=[48])[0]
        torch.testing.assert_close(tail, reference.forward_full(torch.tensor([tokens]))[0, -1], atol=5e-2, rtol=2e-2)


def test_load_errors_are_clear(smollm_export, tmp_path):
    _, artifact, _ = smollm_export
    lm = load_artifact(artifact)
    with pytest.raises(BucketError, match="largest context bucket 64"):
        lm.prefill([0], [[1] * 65])
    with pytest.raises(BucketError, match="sequence length 128"):
        lm.decode(torch.tensor([1, 1]), torch.tensor([0, 128]))
    with pytest.raises(ValueError, match="distinct"):
        lm.decode(torch.tensor([1, 1]), torch.tensor([0, 1]), slots=[1, 1])
    broken = tmp_path / "broken"
    shutil.copytree(artifact, broken)
    (broken / "graphs.pt2").unlink()
    with pytest.raises(ArtifactError, match="missing graphs.pt2"):
        TorchAotBackend().validate_artifact(broken, {})
    config = json.loads((broken / "neuron_config.json").read_text())
    (broken / "neuron_config.json").write_text(json.dumps({**config, "format": "nxd"}))
    with pytest.raises(ArtifactError, match="not a torch-backend artifact"):
        load_artifact(broken)
    (broken / "neuron_config.json").write_text(json.dumps({**config, "format_version": 1}))
    with pytest.raises(ArtifactError, match="artifact format 1"):  # per-bucket graphs of older releases
        load_artifact(broken)


def test_torch_version_mismatch_is_refused(smollm_export, tmp_path):
    _, artifact, _ = smollm_export
    copy = tmp_path / "old"
    shutil.copytree(artifact, copy)
    config = json.loads((copy / "neuron_config.json").read_text())
    config["target"]["torch"] = "2.0.0"
    (copy / "neuron_config.json").write_text(json.dumps(config))
    with pytest.raises(ArtifactError) as info:
        TorchAotBackend().validate_artifact(copy, {})
    assert "2.0.0" in info.value.what and torch.__version__ in info.value.what
    assert "neuronpack compile" in info.value.fix


@pytest.mark.parametrize(("recipe", "what"), [
    ({"speculation": {"kind": "draft", "draft": "d"}}, "speculation"),
    ({"lora": {"adapters": [{"name": "a", "path": "p"}, {"name": "b", "path": "p"}]}}, "lora.max_loras = 2"),
    ({"lora": {"adapters": [{"name": "a", "path": "p"}], "target_modules": ["lm_head"]}}, "lm_head"),
    ({"target": {"tp_degree": 2, "seq_len": 128}}, "tp_degree"),
    ({"target": {"instance": "trn1", "seq_len": 128}}, "instance"),
])
def test_unsupported_recipe_features_are_refused(tiny_llama, tmp_path, recipe, what):
    request = tiny_request(tiny_llama, tmp_path / "s", **recipe)
    with pytest.raises(RecipeError, match=what):
        TorchAotBackend().compile_config(request)
    assert not any((tmp_path / "s").iterdir())


def test_prompt_lookup_is_recorded_for_the_runtime(tiny_llama, tmp_path):
    request = tiny_request(tiny_llama, tmp_path / "s", speculation={"kind": "prompt_lookup", "length": 4})
    config = TorchAotBackend().compile_config(request)
    assert config["speculation"] == {"kind": "prompt_lookup", "length": 4, "prompt_lookup_min": 5,
                                     "prompt_lookup_max": 5}
    plain = TorchAotBackend().compile_config(tiny_request(tiny_llama, tmp_path / "p"))
    assert plain["speculation"] is None
    long = TorchAotBackend().compile_config(tiny_request(tiny_llama, tmp_path / "l", speculation={
        "kind": "prompt_lookup", "length": 32}, target={"batch_size": 2, "seq_len": 128, "max_context_length": 16},
        buckets={"context": [16], "token_generation": [128]}))
    assert long["max_step_tokens"] == 33  # the step graph verifies the last token + 32 drafts
    with pytest.raises(RecipeError, match='kind "draft"') as info:
        TorchAotBackend().compile_config(tiny_request(tiny_llama, tmp_path / "d", speculation={"kind": "draft",
                                                                                             "draft": "d"}))
    assert 'kind = "eagle" or "prompt_lookup"' in info.value.fix
    eagle = TorchAotBackend().compile_config(tiny_request(tiny_llama, tmp_path / "e", speculation={"draft": "d"}))
    assert eagle["speculation"] == {"kind": "eagle", "length": 4, "draft": "draft", "draft_dtype": "float32"}


def test_compile_config_is_torch_free_data(tiny_llama, tmp_path):
    config = TorchAotBackend().compile_config(tiny_request(tiny_llama, tmp_path / "s"))
    assert "target" not in config
    assert "graphs" not in config  # named at build time, from the layers the checkpoint really has
    assert config["max_step_tokens"] == config["max_context_length"]  # no speculation: the longest prompt
    assert config["kv_cache_positions"] == 129  # seq_len + one spare position
    json.dumps(config)  # plain JSON: goes into the key


def test_an_adapter_path_in_neuron_config_that_leaves_the_artifact_is_refused(tmp_path):
    from neuronpack.backends.torch_aot.artifact_config import LoraConfig
    from neuronpack.backends.torch_aot.lora import attach_artifact_lora

    section = {"max_loras": 1, "max_rank": 8, "target_modules": ["q_proj"],
               "adapters": [{"name": "sql", "path": "../outside", "rank": 8}]}
    with pytest.raises(ArtifactError, match="escapes the artifact"):
        attach_artifact_lora(None, LoraConfig.from_dict(section, "test"), tmp_path)  # refused before the model
