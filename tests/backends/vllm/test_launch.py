"""Contract tests for the vLLM launch: artifacts built through the real pipeline with the stand-in SDK, then each
serving target's argv/env, parsed by a stand-in with the real parsers' flags and choices (neuron_standin/vllm_cli.py;
`make upstream-check` runs the real ones)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from neuronpack.backends.vllm.launch import VllmCommand, format_command, neuron_override, run_vllm
from neuronpack.backends.vllm.targets import TARGETS, check_serving_stack, choose_target, vllm_command
from neuronpack.errors import ArtifactError, ServeError
from neuronpack.pipeline import compile_model, verify_artifact
from tests.backends.neuron_standin import fixtures as standin
from tests.backends.neuron_standin.vllm_cli import ParseError, parse

pytestmark = pytest.mark.contract
nxd_sdk, sdk_path = standin.nxd_sdk, standin.sdk_path  # fixtures
TINY_NXD = ["target.framework=nxd", "target.instance=inf2", "target.tp_degree=2", "target.batch_size=2",
            "target.seq_len=256", "target.max_context_length=128", "model.dtype=bfloat16", "name=tiny-nxd"]
SDK_229 = {"neuronx-distributed-inference": "0.9.17334", "neuronx-cc": "2.24.5133.0", "torch-neuronx": "2.9.0.2.13.0",
           "transformers": "4.57.1", "vllm": "0.16.0", "vllm-neuron": "0.5.0"}


def _args(cmd: VllmCommand, target: str):
    assert cmd.argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    return parse(target, cmd.argv[3:])


@pytest.fixture
def nxd_artifact(tiny_llama, tmp_path, nxd_sdk):
    result = compile_model(str(tiny_llama), overrides=TINY_NXD, out_root=tmp_path / "root")
    return result.path, verify_artifact(result.path)


def test_v0_command_parses_and_never_passes_block_size(nxd_artifact):
    path, manifest = nxd_artifact
    for target in ("vllm-v0", "vllm-v0-fork"):
        cmd = vllm_command(path, manifest, target=target, port=8080, api_key="k")
        assert cmd.env == {"NEURON_COMPILED_ARTIFACTS": str(path),
                           "VLLM_NEURON_FRAMEWORK": "neuronx-distributed-inference"}
        assert cmd.cwd == str(path)
        args = _args(cmd, target)
        assert "--block-size" not in cmd.argv  # choices stop at 128; Neuron sets block_size = max_model_len itself
        assert (args.model, args.device, args.dtype, args.tensor_parallel_size, args.max_num_seqs,
                args.max_model_len, args.served_model_name) == (str(path), "neuron", "bfloat16", 2, 2, 256, "tiny-nxd")
        assert args.override_neuron_config == {"context_encoding_buckets": [128], "max_context_length": 128,
                                               "save_sharded_checkpoint": True, "token_generation_buckets": [128, 256]}
    assert format_command(cmd).startswith(f"cd {path} && NEURON_COMPILED_ARTIFACTS={path} ")


def test_the_old_block_size_flag_is_rejected_by_the_parser():
    with pytest.raises(ParseError, match="invalid choice"):
        parse("vllm-v0", ["--model", "m", "--block-size", "256"])


def test_plugin_command_uses_additional_config(nxd_artifact):
    path, manifest = nxd_artifact
    cmd = vllm_command(path, manifest, target="vllm-neuron")
    args = _args(cmd, "vllm-neuron")
    assert args.enable_prefix_caching is False and args.num_gpu_blocks_override == 2
    assert "--override-neuron-config" not in cmd.argv and "--device" not in cmd.argv
    assert args.additional_config == {
        "max_prompt_length": 128,  # == the artifact's max_context_length, or the plugin's runner raises
        "override_neuron_config": {"context_encoding_buckets": [128], "max_context_length": 128,
                                   "save_sharded_checkpoint": True, "token_generation_buckets": [128, 256]}}
    with pytest.raises(ParseError):  # what neuronpack printed before: V0 flags on a V1 parser
        parse("vllm-neuron", ["--model", "m", "--override-neuron-config", "{}"])


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


def _manifest(framework="nxd", **serve):
    base = {"served_model_name": "m", "max_model_len": 4096, "max_num_seqs": 4, "tensor_parallel_size": 8,
            "nodes": 1, "speculation_length": 0, "draft_path": None, "lora_modules": []}
    neuron_config = {"tp_degree": 8, "batch_size": 4, "seq_len": 4096, "max_context_length": 2048,
                     "torch_dtype": "bfloat16", "save_sharded_checkpoint": True}
    return {"framework": framework, "serve": {**base, **serve}, "model": {"path": "/models/llama"},
            "compile_config": {"neuron_config": neuron_config}, "recipe": {},
            "versions": {"neuronx-distributed-inference": "0.9.17334"}}


def test_speculation_per_target_uses_the_bundled_draft(tmp_path):
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "config.json").write_text("{}")
    manifest = _manifest(speculation_length=4, draft_path="/cache/draft")
    manifest["compile_config"]["neuron_config"]["enable_eagle_speculation"] = True
    draft = str(tmp_path / "draft")
    v0 = _args(vllm_command(tmp_path, manifest, target="vllm-v0"), "vllm-v0")
    assert v0.speculative_config == {"model": draft, "num_speculative_tokens": 4, "max_model_len": 4096}
    fork = _args(vllm_command(tmp_path, manifest, target="vllm-v0-fork"), "vllm-v0-fork")
    assert (fork.speculative_model, fork.num_speculative_tokens) == (draft, 4)  # the fork has no --speculative-config
    v1 = _args(vllm_command(tmp_path, manifest, target="vllm-neuron"), "vllm-neuron")
    assert v1.speculative_config == {"method": "eagle", "model": draft, "num_speculative_tokens": 4,
                                     "max_model_len": 4096}


def test_lora_flags_point_into_the_artifact(tmp_path):
    (tmp_path / "lora" / "sql").mkdir(parents=True)
    manifest = _manifest(lora_modules=[{"name": "sql", "path": "/gone/sql"}, {"name": "chat", "path": "/a/chat"}])
    manifest["recipe"] = {"lora": {"max_loras": 2, "max_rank": 32, "target_modules": ["q_proj", "v_proj"]}}
    for target in TARGETS:
        cmd = vllm_command(tmp_path, manifest, target=target)
        args = _args(cmd, target)
        assert args.enable_lora and (args.max_loras, args.max_lora_rank) == (2, 32)
        assert args.lora_modules == [f"sql={tmp_path / 'lora' / 'sql'}", "chat=/a/chat"]
        override = args.additional_config["override_neuron_config"] if target == "vllm-neuron" \
            else args.override_neuron_config
        assert override["target_modules"] == ["q_proj", "v_proj"] and "lora_modules" not in override
        assert cmd.cwd == str(tmp_path)  # NxDI resolves the artifact's relative adapter paths from here


def test_multi_node_follows_the_released_fork_launcher_and_is_refused_elsewhere(tmp_path):
    manifest = _manifest(nodes=2, tensor_parallel_size=64)
    cmd = vllm_command(tmp_path, manifest, target="vllm-v0-fork", port=8080)
    assert cmd.argv[:2] == ["bash", "${VLLM_SRC}/examples/neuron/multi_node/multi_node_launcher.sh"]
    i = cmd.argv.index("${VLLM_SRC}/examples/neuron/multi_node/launch_script.py")
    opts = dict(zip(cmd.argv[i + 1::2], cmd.argv[i + 2::2], strict=False))
    assert opts["--world-size"] == "64" and opts["--local-ranks-size"] == "32"
    assert opts["--compiled-model-path"] == str(tmp_path) and opts["--max-context-length"] == "2048"
    assert "NEURON_MULTI_NODE" not in format_command(cmd)  # only an unmerged PR used that variable
    assert '"${MASTER_ADDR}"' in format_command(cmd)
    with pytest.raises(ServeError, match="head node"):
        run_vllm(cmd)
    with pytest.raises(ServeError, match="no multi-node"):
        vllm_command(tmp_path, manifest, target="vllm-v0")
    with pytest.raises(ServeError, match="world size 1"):
        vllm_command(tmp_path, manifest, target="vllm-neuron")


def test_tnx_env_buckets_and_quant(tmp_path):
    manifest = _manifest("tnx")
    manifest["compile_config"] = {
        "from_pretrained": {"amp": "bf16", "n_positions": [512, 2048], "context_length_estimate": [256, 1024]},
        "neuron_config": {"quant": {"quant_dtype": "s8"}}}
    cmd = vllm_command(tmp_path, manifest, target="vllm-v0")
    assert cmd.env["VLLM_NEURON_FRAMEWORK"] == "transformers-neuronx"
    assert cmd.env["NEURON_CONTEXT_LENGTH_BUCKETS"] == "256,1024"
    assert cmd.env["NEURON_TOKEN_GEN_BUCKETS"] == "512,2048"
    assert cmd.env["NEURON_QUANT_DTYPE"] == "s8"
    args = _args(cmd, "vllm-v0")
    assert args.quantization == "neuron_quant" and args.model == "/models/llama" and args.dtype == "bfloat16"
    assert any("same graphs are not promised" in n for n in cmd.notes)
    with pytest.raises(ServeError, match="NxD Inference artifacts only"):
        vllm_command(tmp_path, manifest, target="vllm-neuron")


def test_target_detection_from_installed_versions():
    assert choose_target("auto", "nxd", {"vllm": "0.16.0", "vllm-neuron": "0.5.0"}).name == "vllm-neuron"
    assert choose_target("auto", "nxd", {"vllm": "0.13.0", "vllm-neuron": "0.4.1"}).name == "vllm-neuron"
    assert choose_target("auto", "nxd", {"vllm": "0.9.2"}).name == "vllm-v0"
    assert choose_target("auto", "nxd", {"vllm": "0.7.3.dev0+neuron224"}).name == "vllm-v0-fork"
    assert choose_target("auto", "nxd", {}).name == "vllm-neuron"
    assert choose_target("auto", "tnx", {}).name == "vllm-v0"
    assert choose_target("vllm-v0", "nxd", {"vllm": "0.16.0", "vllm-neuron": "0.5.0"}).name == "vllm-v0"
    with pytest.raises(ServeError, match="no Neuron V0 engine"):
        choose_target("auto", "nxd", {"vllm": "0.11.0"})
    with pytest.raises(ServeError, match="unknown vLLM target"):
        choose_target("vllm-v2", "nxd", {})


@pytest.mark.parametrize("version", ["1.0.0", "0.21.0.1.0.0", "0.24.0.1.1.0"])
def test_an_nxd_artifact_on_the_sdk_231_plugin_points_at_the_vneuron_framework(version):
    # the new plugin serves vneuron artifacts (backends/vneuron/launch.py); an NxDI artifact it cannot load
    with pytest.raises(ServeError, match="cannot load NxD Inference artifacts") as info:
        choose_target("auto", "nxd", {"vllm": "0.21.0", "vllm-neuron": version})
    assert "--framework vneuron" in info.value.fix and "vllm-neuron 0.5.0" in info.value.fix


def test_pairing_mismatch_is_refused_before_vllm_starts(tmp_path):
    from neuronpack.backends.vllm.launch import launch_spec

    spec = launch_spec(tmp_path, _manifest())
    assert check_serving_stack(spec, "vllm-neuron", SDK_229) == "sdk-2.29-vllm-neuron-0.5"
    with pytest.raises(ServeError, match="is not a vllm-neuron pairing"):  # vLLM 0.16 with plugin 0.4
        check_serving_stack(spec, "vllm-neuron", {**SDK_229, "vllm-neuron": "0.4.1"})
    old = launch_spec(tmp_path, {**_manifest(), "versions": {"neuronx-distributed-inference": "0.8.16251"}})
    with pytest.raises(ServeError, match="not with this machine's pairing sdk-2.29"):  # built on SDK 2.28
        check_serving_stack(old, "vllm-neuron", SDK_229)
    note = vllm_command(tmp_path, _manifest(), target="vllm-v0").notes  # NxDI 0.9 artifact on vLLM 0.9 V0
    assert any("pairs with no vllm-v0 stack" in n for n in note)


def test_torch_artifacts_are_not_for_vllm(tmp_path):
    with pytest.raises(ArtifactError, match="built for 'torch'"):
        vllm_command(tmp_path, {"framework": "torch"})


def test_run_vllm_refuses_without_vllm_and_execs_otherwise(tmp_path):
    with pytest.raises(ServeError, match="vllm is not installed"):
        run_vllm(VllmCommand([sys.executable, "-m", "vllm.entrypoints.openai.api_server"], {}))
    # exec really replaces the process (in cmd.cwd): run it in a child and read what the exec'd program saw
    script = ("import sys; from neuronpack.backends.vllm.launch import VllmCommand, run_vllm; "
              "run_vllm(VllmCommand([sys.executable, '-c', 'import os; print(os.environ[\"NEURON_X\"], os.getcwd())'], "
              f"{{'NEURON_X': 'from-env'}}, cwd={str(tmp_path)!r}))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["from-env", str(tmp_path)]


@pytest.mark.parametrize("target", ["vllm-v0", "vllm-v0-fork", "vllm-neuron"])
def test_tool_call_parser_reaches_every_targets_openai_server(nxd_artifact, target):
    """`serve --tool-call-parser hermes`: vLLM's auto tool choice on every single-node target (what
    tool_choice "auto" needs there); the multi-node launcher, whose api_server has no tools, refuses it."""
    path, manifest = nxd_artifact
    args = _args(vllm_command(path, manifest, target=target, tool_call_parser="hermes"), target)
    assert args.enable_auto_tool_choice and args.tool_call_parser == "hermes"
    assert not _args(vllm_command(path, manifest, target=target), target).enable_auto_tool_choice


def test_tool_call_parser_is_refused_by_the_multi_node_launcher(tmp_path):
    with pytest.raises(ServeError, match="no tool calling"):
        vllm_command(tmp_path, _manifest(nodes=2, tensor_parallel_size=64), target="vllm-v0-fork",
                     tool_call_parser="hermes")


@pytest.mark.parametrize(("target", "version", "name"), [("vllm-v0-fork", None, "pythonic"),
                                                         ("vllm-v0", "0.9.2", "llama4_json"),
                                                         ("vllm-neuron", "0.16.0", "qwen3_coder")])
def test_tool_call_parser_names_are_the_targets_vllm_registry(tmp_path, target, version, name):
    """A name the target's vLLM registers passes (and the stand-in, with upstream's registry written out apart,
    accepts it); one it lacks is refused in one line naming the choices, before vLLM would KeyError at start."""
    cmd = vllm_command(tmp_path, _manifest(), target=target, tool_call_parser=name, vllm_version=version)
    assert _args(cmd, target).tool_call_parser == name
    with pytest.raises(ServeError, match="registers no tool call parser 'hermes2'") as err:
        vllm_command(tmp_path, _manifest(), target=target, tool_call_parser="hermes2", vllm_version=version)
    assert "use one of: " in err.value.fix and "hermes" in err.value.fix and "\n" not in err.value.one_line()
    with pytest.raises(ParseError, match="invalid tool call parser"):
        parse(target, ["--model", "m", "--enable-auto-tool-choice", "--tool-call-parser", "hermes2"])


def test_tool_call_parser_of_a_newer_vllm_is_noted_or_refused_by_the_installed_one(tmp_path):
    # qwen3_coder: vLLM 0.13 / 0.16 (vllm-neuron), not 0.9.2 or the fork's 0.7.2; step3p5: 0.16 only
    with pytest.raises(ServeError, match=r"vLLM 0\.7\.2 \(vllm-v0-fork\)"):
        vllm_command(tmp_path, _manifest(), target="vllm-v0-fork", tool_call_parser="qwen3_coder")
    cmd = vllm_command(tmp_path, _manifest(), target="vllm-neuron", tool_call_parser="step3p5")  # printing: a note
    assert any("registered by vLLM 0.16.0 only" in n for n in cmd.notes)
    with pytest.raises(ServeError, match=r"vLLM 0\.13\.0 \(vllm-neuron\)"):
        vllm_command(tmp_path, _manifest(), target="vllm-neuron", tool_call_parser="step3p5", vllm_version="0.13.0")


def _sampling(on_device: bool):
    manifest = _manifest()
    if on_device:
        manifest["compile_config"]["neuron_config"]["on_device_sampling_config"] = {"dynamic": True, "top_k": 1}
    return manifest


@pytest.mark.parametrize("target", TARGETS)
def test_structured_outputs_on_an_on_device_sampling_artifact_are_refused_or_noted(tmp_path, target):
    """vllm-neuron ignores the grammar bitmask when the artifact samples on device; V0's Neuron runner runs the
    guided-decoding logits processors only on host logits: --structured-outputs refuses, without it a note."""
    with pytest.raises(ServeError, match="cannot be honoured") as err:
        vllm_command(tmp_path, _sampling(True), target=target, structured_outputs=True)
    assert "sampling.on_device=false" in err.value.fix
    cmd = vllm_command(tmp_path, _sampling(True), target=target)
    assert sum("NOT enforced" in n for n in cmd.notes) == 1
    assert "NEURON_ON_DEVICE_SAMPLING_DISABLED" not in cmd.env


@pytest.mark.parametrize("target", TARGETS)
def test_structured_outputs_on_a_host_sampling_artifact(tmp_path, target):
    """Host sampling compiled in: the plugin's CPU sampling path applies the bitmask as it is; V0 needs
    NEURON_ON_DEVICE_SAMPLING_DISABLED=1 to compute logits (and run the processors) on the host."""
    cmd = vllm_command(tmp_path, _sampling(False), target=target, structured_outputs=True)
    v0 = target != "vllm-neuron"
    assert cmd.env.get("NEURON_ON_DEVICE_SAMPLING_DISABLED") == ("1" if v0 else None)
    assert not any("NOT enforced" in n for n in cmd.notes)
    assert vllm_command(tmp_path, _sampling(False), target=target).env == cmd.env  # the flag only refuses
    _args(cmd, target)  # no backend flag: each vLLM's default structured-outputs backend


def test_structured_outputs_on_tnx_ask_vllm_for_host_sampling(tmp_path):
    manifest = _manifest("tnx")
    manifest["compile_config"] = {"from_pretrained": {"amp": "bf16"}, "neuron_config": {"on_device_generation": {}}}
    assert any("NOT enforced" in n for n in vllm_command(tmp_path, manifest, target="vllm-v0").notes)
    cmd = vllm_command(tmp_path, manifest, target="vllm-v0", structured_outputs=True)
    assert cmd.env["NEURON_ON_DEVICE_SAMPLING_DISABLED"] == "1"


def test_structured_outputs_are_refused_by_the_multi_node_launcher(tmp_path):
    with pytest.raises(ServeError, match="no response_format"):
        vllm_command(tmp_path, _manifest(nodes=2, tensor_parallel_size=64), target="vllm-v0-fork",
                     structured_outputs=True)
