"""Runs inside a throwaway venv with upstream source on PYTHONPATH: feeds neuronpack's output to upstream's own config
classes and argument parsers. Reads cases (JSON) from argv[2], prints one JSON result per case. Never imported by
neuronpack. Usage: python upstream_check_worker.py nxdi|vllm CASES.json
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import io
import json
import logging
import os
import sys
import traceback
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import upstream_stubs  # noqa: E402

# NxD (neuronx_distributed) loads Neuron torch classes at import: stubbed, except its pure quantization enums and the
# MoE config classes MoENeuronConfig builds (BlockwiseMatmulConfig, RouterConfig)
REAL_SUBMODULES = ["neuronx_distributed.quantization.quantization_config",
                   "neuronx_distributed.modules.moe.moe_configs", "neuronx_distributed.modules.moe.model_utils"]
# what vllm-neuron 0.4.1 / 0.5.0's get_neuron_model builds as NeuronMultiModalCausalLM (its load_weights validates the
# override with _validate_image_to_text_override_neuron_config); every other architecture is a NeuronCausalLM
IMAGE_TO_TEXT = ("LlavaForConditionalGeneration", "Llama4ForConditionalGeneration",
                 "Qwen2VLForConditionalGeneration", "Qwen3VLForConditionalGeneration")
DEVICE_ONLY = ["torch_neuronx", "torch_xla", "neuronxcc", "libneuronxla", "neuronx_distributed", "nki", "nkilib",
               "torchvision", "blake3", "partial_json_parser", "llguidance", "diskcache", "xgrammar",
               "lmformatenforcer"]
# the project environment's packages (seen through the venv's .pth) that upstream's environment would not hold and
# that break its imports: transformers 5's `kernels` needs huggingface_hub >= 1.32, and the V0 venv's transformers
# 4.53 imports it whenever it is installed (its `from kernels import get_kernel` fails against hub 0.36)
HIDDEN = ["kernels"]


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _real_neuron_config(model_class: str, kwargs: dict):
    module, _, name = model_class.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    catcher = _Warnings()
    root = logging.getLogger()
    level = root.level
    # NxDI logs an unknown kwarg with logging.warning (the root logger) and drops it: main() sets the root to ERROR,
    # which would discard that record before any handler saw it
    root.setLevel(logging.WARNING)
    root.addHandler(catcher)
    try:
        config = cls.get_neuron_config_cls()(**copy.deepcopy(kwargs))
    finally:
        root.removeHandler(catcher)
        root.setLevel(level)
    unexpected = [m for m in catcher.messages if "Unexpected keyword" in m]
    if unexpected:
        raise ValueError(unexpected[0])
    return cls, config


def check_nxdi(case: dict) -> str:
    from neuronx_distributed_inference.utils.hf_adapter import load_pretrained_config

    os.chdir(case["cwd"])  # LoRA paths are relative to the artifact, as when vLLM runs there
    cls, neuron_config = _real_neuron_config(case["model_class"], case["neuron_config"])
    if case.get("vision_neuron_config"):  # NxDI's image-to-text class (Llama 4), as vLLM's plugin builds it
        _, vision = _real_neuron_config(case["model_class"], case["vision_neuron_config"])
        cls.get_config_cls()(text_neuron_config=neuron_config, vision_neuron_config=vision,
                             load_config=load_pretrained_config(case["model_dir"]))
        return "ok (text + vision NeuronConfig)"
    cls.get_config_cls()(neuron_config, load_config=load_pretrained_config(case["model_dir"]))
    draft = case.get("draft")
    if draft:
        # upstream's way (vLLM loaders, inference_demo): deep copy of the target object, then attributes
        copied = copy.deepcopy(neuron_config)
        for key in ("speculation_length", "enable_fused_speculation", "is_eagle_draft", "sequence_parallel_enabled"):
            if key in draft["neuron_config"]:
                setattr(copied, key, draft["neuron_config"][key])
        if copied.enable_fused_speculation:
            raise ValueError("draft NeuronConfig has enable_fused_speculation on")
        cls.get_config_cls()(copied, load_config=load_pretrained_config(draft["path"]))
    return "ok"


def _parser():
    from vllm.entrypoints.openai.cli_args import make_arg_parser

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    return make_arg_parser(FlexibleArgumentParser())


def check_vllm(case: dict) -> str:
    argv = case["argv"]
    if argv[0] == "bash":
        return _check_fork_launcher(case)
    if case["target"] == "vllm-neuron":
        # what the plugin's entry point does on a Neuron machine (its register() looks for /dev/neuron*)
        import vllm.platforms
        from vllm_neuron.platform import NeuronPlatform

        vllm.platforms.current_platform = NeuronPlatform()
        NeuronPlatform.pre_register_and_update()
    elif case["target"] == "vneuron":
        # the 0.21 plugin's platform module is not in the pinned partial tree: vLLM's own CPU platform stands in, so
        # what is checked is vLLM 0.21's parser and EngineArgs (the flags), not the plugin's platform hooks
        import vllm.platforms
        from vllm.platforms.cpu import CpuPlatform

        vllm.platforms.current_platform = CpuPlatform()
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.openai import cli_args

    os.chdir(case["cwd"])  # where serve starts vLLM (the artifact)
    if "--" in argv:  # vneuron: neuronpack's pod start (backends/vneuron/pod.py) runs the vLLM argv after "--"
        argv = argv[argv.index("--") + 1:]
    args = _parser().parse_args(argv[3:])
    if hasattr(cli_args, "validate_parsed_serve_args"):
        cli_args.validate_parsed_serve_args(args)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    neuron_config = case["neuron_config"]
    details = []
    if case["target"] == "vllm-v0-fork":
        block = engine_args._get_block_size()
        if block != case["max_model_len"]:
            raise ValueError(f"block size {block} != max_model_len {case['max_model_len']} (contiguous KV)")
        details.append("block_size=max_model_len")
    if getattr(args, "enable_auto_tool_choice", False):
        details.append(_check_tool_parser(args))
    if case.get("model_class") and (neuron_config or {}).get("on_device_sampling_config", {}) is None:  # nxd
        details.append(_check_host_sampling(case))
    if case["target"] == "vllm-neuron":
        details += _check_plugin(engine_args, case)
    elif case["target"] == "vneuron":
        details += _check_vneuron(engine_args, case)
    elif neuron_config is not None and engine_args.override_neuron_config:
        # V0 loader: setattr every override key onto the loaded neuron_config.json, then it must still be valid
        loaded = {**neuron_config, **engine_args.override_neuron_config}
        loaded.pop("lora_modules", None)
        loaded.pop("target_modules", None)
        _real_neuron_config(case["model_class"], loaded)
        details.append("override on loaded config")
    return "ok" + (f" ({', '.join(details)})" if details else "")


def _check_tool_parser(args) -> str:
    """What validate_api_server_args (entrypoints/openai/api_server.py) checks when the server starts: the name is in
    that vLLM's ToolParserManager registry (0.13+: vllm/tool_parsers; before: vllm/entrypoints/openai/tool_parsers)."""
    try:
        from vllm.tool_parsers import ToolParserManager
    except ImportError:
        from vllm.entrypoints.openai.tool_parsers import ToolParserManager
    names = (ToolParserManager.list_registered() if hasattr(ToolParserManager, "list_registered")
             else list(ToolParserManager.tool_parsers))
    if args.tool_call_parser not in names:
        raise KeyError(f"invalid tool call parser: {args.tool_call_parser} (chose from {','.join(names)})")
    return f"tool parser {args.tool_call_parser}"


def _check_host_sampling(case: dict) -> str:
    """Structured outputs need host logits: vllm-neuron's sample_tokens applies the grammar bitmask only when the
    loaded NeuronConfig has no on_device_sampling_config; V0's runner computes logits (running the guided-decoding
    processors) only with NEURON_ON_DEVICE_SAMPLING_DISABLED=1."""
    from neuronx_distributed_inference.models.config import NeuronConfig

    loaded = {k: v for k, v in case["neuron_config"].items() if k not in ("lora_config",)}
    if NeuronConfig(**loaded).on_device_sampling_config is not None:
        raise ValueError("NxDI's NeuronConfig turned on-device sampling back on: no host logits for grammars")
    if case["target"] != "vllm-neuron" and case["env"].get("NEURON_ON_DEVICE_SAMPLING_DISABLED") != "1":
        raise ValueError("V0 without NEURON_ON_DEVICE_SAMPLING_DISABLED=1: its runner never computes logits")
    return "host sampling"


def _check_plugin(engine_args, case: dict) -> list[str]:
    from neuronx_distributed_inference.models.config import NeuronConfig
    from vllm_neuron.worker import neuronx_distributed_model_loader as loader
    from vllm_neuron.worker.neuronx_distributed_model_runner import NeuronxDistributedModelRunner

    additional = engine_args.additional_config or {}
    if "override_neuron_config" not in additional:
        raise ValueError("additional_config has no override_neuron_config (the runner pops from it)")
    if engine_args.enable_prefix_caching is not False:
        raise ValueError("prefix caching is on: the contiguous-KV artifact needs --no-enable-prefix-caching")
    if engine_args.num_gpu_blocks_override != engine_args.max_num_seqs:
        raise ValueError("num_gpu_blocks_override != max_num_seqs")
    mpl = additional.get("max_prompt_length")
    # get_neuron_model's order: the generic validation (it adds max_context_length when max_prompt_length is set),
    # then, for an image-to-text model, its own on what that returned
    override = loader._validate_override_neuron_config(dict(additional["override_neuron_config"]),
                                                       SimpleNamespace(max_prompt_length=mpl))
    details = []
    if case.get("architecture") in IMAGE_TO_TEXT:
        loader._validate_image_to_text_override_neuron_config(override)
        details.append("image-to-text override")
    if hasattr(loader, "_get_neuron_model_cls") and case.get("architecture"):
        cls = loader._get_neuron_model_cls(case["architecture"])  # the class the plugin loads the artifact with
        if f"{cls.__module__}.{cls.__name__}" != case["model_class"]:
            details.append(f"loads with {cls.__name__}")
    loaded = {k: v for k, v in case["neuron_config"].items() if k not in ("lora_config",)}
    fake = SimpleNamespace(model=SimpleNamespace(neuron_config=NeuronConfig(**loaded)),
                           vllm_config=SimpleNamespace(model_config=SimpleNamespace(max_prompt_length=mpl)),
                           max_model_len=engine_args.max_model_len)
    NeuronxDistributedModelRunner._validate_max_prompt_length(fake)
    return ["max_prompt_length", "override_neuron_config", *details]


def _check_vneuron(engine_args, case: dict) -> list[str]:
    """The SDK 2.31+ plugin (0.21): vLLM took the flags; the worker's neuron_config is there; the plugin's own envs.py
    resolves the environment serve sets to the root serve fills, with a local miss fatal and no capture at start."""
    neuron_config = (engine_args.additional_config or {}).get("neuron_config")
    if not isinstance(neuron_config, dict) or not neuron_config.get("num_batched_tokens_buckets"):
        raise ValueError("additional_config has no neuron_config with num_batched_tokens_buckets")
    if max(neuron_config["num_batched_tokens_buckets"]) != engine_args.max_num_batched_tokens:
        raise ValueError("the largest num_batched_tokens bucket must equal max_num_batched_tokens")
    if max(neuron_config["num_seqs_buckets"]) != engine_args.max_num_seqs:
        raise ValueError("the largest num_seqs bucket must equal max_num_seqs")
    if engine_args.num_gpu_blocks_override is None:
        raise ValueError("no --num-gpu-blocks-override: the pod's KV block count would differ from the CPU compile's")
    os.environ.update(case["env"])
    from vllm_neuron import envs

    root = envs.get_neuron_compile_cache_dir()
    if root != os.path.join(case["env"]["VLLM_CACHE_ROOT"], "neuron/compile_cache"):
        raise ValueError(f"the plugin resolves the cache root to {root}")
    if not (envs.VLLM_NEURON_DISABLE_WARMUP_COMPILE and envs.VLLM_NEURON_DISABLE_GRAPH_CAPTURE_BACKEND):
        raise ValueError("a local miss would not be fatal, or the pod would capture and compile graphs at start")
    if any(getattr(envs, f"VLLM_NEURON_{name}") for name in ("DISABLE_COMPILE_CACHE", "CPU_COMPILE")):
        raise ValueError("the cache is disabled, or the pod would CPU-compile")
    return ["neuron_config buckets", "cache root + local miss fatal + no capture (envs.py)"]


def _check_fork_launcher(case: dict) -> str:
    script = os.path.join(case["vllm_src"], "examples/neuron/multi_node/launch_script.py")
    spec = importlib.util.spec_from_file_location("launch_script", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = case["argv"]
    start = next(i for i, a in enumerate(argv) if a.endswith("launch_script.py")) + 1
    sys.argv = [script, *argv[start:]]
    args = module.arg_parser()
    for rank in range(case["nodes"]):
        override = module.make_override_config(args, rank)
        _real_neuron_config(case["model_class"], {**case["neuron_config"], **override})
    return f"ok (launcher, {case['nodes']} ranks)"


def main() -> None:
    kind, path = sys.argv[1], sys.argv[2]
    upstream_stubs.install(DEVICE_ONLY, auto=False, real=REAL_SUBMODULES, hidden=HIDDEN)
    logging.basicConfig(level=logging.ERROR)
    check = check_nxdi if kind == "nxdi" else check_vllm
    start, environ = os.getcwd(), dict(os.environ)
    for case in json.loads(open(path).read()):
        err = io.StringIO()
        # what neuronpack's build sets (NxDI asks the device otherwise)
        os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"] = case.get("platform_target") or "trn1"
        try:
            with contextlib.redirect_stderr(err):
                result = check(case)
        except BaseException as exc:  # noqa: BLE001 - every failure is a result line (argparse exits)
            last = traceback.extract_tb(exc.__traceback__)[-1]
            where = f"{os.path.basename(last.filename)}:{last.lineno}"
            text = str(exc).splitlines()[0] if str(exc) else ""
            if isinstance(exc, SystemExit):
                lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
                text = lines[-1] if lines else text
            result = f"failed: {type(exc).__name__}: {text} [{where}]"
        finally:
            os.chdir(start)
            # each case is checked on its own environment (_check_vneuron sets the case's variables)
            os.environ.clear()
            os.environ.update(environ)
        print(json.dumps({"id": case["id"], "result": result[:300]}), flush=True)


if __name__ == "__main__":
    main()
