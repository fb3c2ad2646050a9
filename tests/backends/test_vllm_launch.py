"""Contract tests for the vLLM launch line: artifacts built through the real pipeline with the stand-in SDK, then
the exact argv/env vLLM 0.9 needs to load them instead of recompiling."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from neuronpack.backends.vllm_launch import VllmCommand, format_command, neuron_override, run_vllm, vllm_command
from neuronpack.errors import ArtifactError, ServeError
from neuronpack.pipeline import compile_model, verify_artifact
from tests.backends.neuron_standin import fixtures as standin
from tests.manifests import make_manifest

pytestmark = pytest.mark.contract
nxd_sdk, sdk_path = standin.nxd_sdk, standin.sdk_path  # fixtures
TINY_NXD = ["target.framework=nxd", "target.instance=inf2", "target.tp_degree=2", "target.batch_size=2",
            "target.seq_len=256", "target.max_context_length=128", "model.dtype=bfloat16", "name=tiny-nxd"]


def _argv_opts(argv: list[str]) -> dict[str, str]:
    opts, i = {}, 3
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            opts[argv[i]] = argv[i + 1]
            i += 2
        else:
            opts[argv[i]] = ""
            i += 1
    return opts


@pytest.fixture
def nxd_artifact(tiny_llama, tmp_path, nxd_sdk):
    result = compile_model(str(tiny_llama), overrides=TINY_NXD, out_root=tmp_path / "root")
    return result.path, verify_artifact(result.path)


def test_nxd_command_loads_the_artifact(nxd_artifact):
    path, manifest = nxd_artifact
    assert manifest.versions["neuronx-distributed-inference"] == "0.9.0"
    assert manifest.versions["neuronx-cc"] == "2.19.8089.0"
    cmd = vllm_command(path, manifest, port=8080, api_key="k")
    assert cmd.env == {"NEURON_COMPILED_ARTIFACTS": str(path), "VLLM_NEURON_FRAMEWORK": "neuronx-distributed-inference"}
    assert cmd.argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    opts = _argv_opts(cmd.argv)
    assert {k: v for k, v in opts.items() if k != "--override-neuron-config"} == {
        "--model": str(path), "--host": "127.0.0.1", "--port": "8080", "--served-model-name": "tiny-nxd",
        "--api-key": "k", "--device": "neuron", "--dtype": "bfloat16", "--tensor-parallel-size": "2",
        "--max-num-seqs": "2", "--max-model-len": "256", "--block-size": "256"}
    # only what differs from vLLM's default NeuronConfig, and never a nested config object
    assert json.loads(opts["--override-neuron-config"]) == {
        "context_encoding_buckets": [128], "max_context_length": 128, "save_sharded_checkpoint": True,
        "token_generation_buckets": [128, 256]}
    line = format_command(cmd)
    assert line.startswith(f"NEURON_COMPILED_ARTIFACTS={path} VLLM_NEURON_FRAMEWORK=neuronx-distributed-inference ")
    assert "--override-neuron-config '{\"context_encoding_buckets\": [128]," in line


def test_override_diff_against_vllm_defaults():
    n = {"tp_degree": 8, "batch_size": 4, "ctx_batch_size": 1, "tkg_batch_size": 4, "seq_len": 4096,
         "max_context_length": 4096, "torch_dtype": "bfloat16", "enable_bucketing": True,
         "is_continuous_batching": True, "padding_side": "right", "sequence_parallel_enabled": True,
         "quantized": True, "on_device_sampling_config": {"top_k": 1}, "speculation_length": 4,
         "enable_fused_speculation": True, "enable_eagle_speculation": True}
    assert neuron_override(n, speculation=True) == {
        "enable_eagle_speculation": True, "padding_side": "right", "quantized": True,
        "sequence_parallel_enabled": True}
    assert neuron_override(n) == {"enable_eagle_speculation": True, "enable_fused_speculation": True,
                                  "quantized": True, "speculation_length": 4}


def _manifest(framework="nxd", *, recipe=None, compile_config=None, **serve):
    base = {"served_model_name": "m", "max_model_len": 4096, "max_num_seqs": 4, "tensor_parallel_size": 8,
            "nodes": 1, "speculation_length": 0, "draft_path": None, "lora_modules": []}
    neuron_config = {"tp_degree": 8, "batch_size": 4, "seq_len": 4096, "max_context_length": 4096,
                     "torch_dtype": "bfloat16", "save_sharded_checkpoint": True}
    return make_manifest(framework=framework, serve={**base, **serve}, model={"path": "/models/llama"},
                         compile_config=compile_config or {"neuron_config": neuron_config}, recipe=recipe or {})


def test_speculation_uses_the_bundled_draft(tmp_path):
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "config.json").write_text("{}")
    manifest = _manifest(speculation_length=4, draft_path="/cache/draft")
    opts = _argv_opts(vllm_command(tmp_path, manifest).argv)
    assert json.loads(opts["--speculative-config"]) == {
        "model": str(tmp_path / "draft"), "num_speculative_tokens": 4, "max_model_len": 4096}


def test_lora_flags_and_override(tmp_path):
    adapters = [{"name": "sql", "path": "/a/sql"}, {"name": "chat", "path": "/a/chat"}]
    manifest = _manifest(lora_modules=adapters, recipe={"lora": {
        "adapters": adapters, "max_loras": 2, "max_rank": 32, "target_modules": ["q_proj", "v_proj"]}})
    cmd = vllm_command(tmp_path, manifest)
    i = cmd.argv.index("--enable-lora")
    assert cmd.argv[i:i + 8] == ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "32", "--lora-modules",
                                 "sql=/a/sql", "chat=/a/chat"]
    override = json.loads(cmd.argv[cmd.argv.index("--override-neuron-config") + 1])
    assert override["lora_modules"] == [{"name": "sql", "path": "/a/sql"}, {"name": "chat", "path": "/a/chat"}]
    assert override["target_modules"] == ["q_proj", "v_proj"]


def test_multi_node_lines(tmp_path):
    cmd = vllm_command(tmp_path, _manifest(nodes=2, tensor_parallel_size=64))
    assert len(cmd.per_node) == 2
    node1 = cmd.per_node[1]
    assert node1.argv[1] == "neuron_multi_node_runner.py"
    assert node1.env["NEURON_RANK_ID"] == "1" and node1.env["NEURON_LOCAL_TP"] == "32"
    assert node1.env["NEURON_RT_ROOT_COMM_ID"] == "${MASTER_ADDR}:8990"
    override = json.loads(node1.argv[node1.argv.index("--override-neuron-config") + 1])
    assert (override["start_rank_id"], override["local_ranks_size"]) == (32, 32)
    text = format_command(cmd)
    assert text.count("# node ") == 2 and 'NEURON_RT_ROOT_COMM_ID="${MASTER_ADDR}:8990"' in text
    assert any("vLLM mainline runs tensor parallelism within one node only" in n for n in cmd.notes)
    with pytest.raises(ServeError, match="every node"):
        run_vllm(cmd)


def test_tnx_env_buckets_and_quant(tmp_path):
    manifest = _manifest("tnx", compile_config={
        "from_pretrained": {"amp": "bf16", "n_positions": [512, 2048], "context_length_estimate": [256, 1024]},
        "neuron_config": {"quant": {"quant_dtype": "s8"}}})
    cmd = vllm_command(tmp_path, manifest)
    assert cmd.env["VLLM_NEURON_FRAMEWORK"] == "transformers-neuronx"
    assert cmd.env["NEURON_CONTEXT_LENGTH_BUCKETS"] == "256,1024"
    assert cmd.env["NEURON_TOKEN_GEN_BUCKETS"] == "512,2048"
    assert cmd.env["NEURON_QUANT_DTYPE"] == "s8"
    opts = _argv_opts(cmd.argv)
    assert opts["--quantization"] == "neuron_quant" and opts["--model"] == "/models/llama"
    assert opts["--dtype"] == "bfloat16"


def test_torch_artifacts_are_not_for_vllm(tmp_path):
    with pytest.raises(ArtifactError, match="built for 'torch'"):
        vllm_command(tmp_path, make_manifest(framework="torch"))


def test_run_vllm_refuses_without_vllm_and_execs_otherwise(tmp_path):
    with pytest.raises(ServeError, match="vllm is not installed"):
        run_vllm(VllmCommand([sys.executable, "-m", "vllm.entrypoints.openai.api_server"], {}))
    # exec really replaces the process: run it in a child and read what the exec'd program saw
    script = ("import sys; from neuronpack.backends.vllm_launch import VllmCommand, run_vllm; "
              "run_vllm(VllmCommand([sys.executable, '-c', 'import os; print(os.environ[\"NEURON_X\"])'], "
              "{'NEURON_X': 'from-env'}))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "from-env"
