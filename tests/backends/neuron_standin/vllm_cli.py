"""TEST STAND-IN for the vLLM argument parsers neuronpack feeds (vLLM cannot be installed here).

One strict argparse parser per serving target with the flags, types and choices of the real ones (read from
vllm/engine/arg_utils.py + entrypoints/openai/cli_args.py of vLLM 0.9.2, the AWS fork 2.24.0 (vLLM 0.7.2 base),
vLLM 0.13.0 / 0.16.0 for vllm-neuron): an unknown flag or a value outside its choices fails, as it does upstream.
`make upstream-check` runs the real parsers.
"""

from __future__ import annotations

import argparse
import json

BLOCK_SIZES = {"vllm-v0": [1, 8, 16, 32, 64, 128], "vllm-v0-fork": [8, 16, 32, 64, 128],
               "vllm-neuron": [1, 8, 16, 32, 64, 128, 256]}
LORA_RANKS = [8, 16, 32, 64, 128, 256, 320, 512]
# ToolParserManager's registry of each target's vLLM (fork 2.24.0 = 0.7.2 base and 0.9.2: the register_module
# decorators in vllm/entrypoints/openai/tool_parsers/*.py; vllm-neuron 0.5.0 = vLLM 0.16.0: _TOOL_PARSERS_TO_REGISTER
# in vllm/tool_parsers/__init__.py). Written out here, not imported from neuronpack, so the two are checked apart.
TOOL_PARSERS = {
    "vllm-v0-fork": {"granite", "granite-20b-fc", "hermes", "internlm", "jamba", "llama3_json", "mistral", "pythonic"},
    "vllm-v0": {"deepseek_v3", "granite", "granite-20b-fc", "hermes", "internlm", "jamba", "llama3_json",
                "llama4_json", "llama4_pythonic", "minimax", "mistral", "phi4_mini_json", "pythonic", "xlam"},
    "vllm-neuron": {"deepseek_v3", "deepseek_v31", "deepseek_v32", "ernie45", "functiongemma", "gigachat3", "glm45",
                    "glm47", "granite", "granite-20b-fc", "hermes", "hunyuan_a13b", "internlm", "jamba", "kimi_k2",
                    "llama3_json", "llama4_json", "llama4_pythonic", "longcat", "minimax", "minimax_m2", "mistral",
                    "olmo3", "openai", "phi4_mini_json", "pythonic", "qwen3_coder", "qwen3_xml", "seed_oss", "step3",
                    "step3p5", "xlam"},
}


class ParseError(ValueError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ParseError(message)


def parse(target: str, argv: list[str]) -> argparse.Namespace:
    """Parse the part after ``-m vllm.entrypoints.openai.api_server`` as that target's vLLM would."""
    p = _Parser(prog=target, allow_abbrev=False)
    for flag in ("--model", "--host", "--served-model-name", "--api-key", "--dtype", "--lora-modules"):
        p.add_argument(flag, nargs="+" if flag == "--lora-modules" else None)
    for flag in ("--port", "--tensor-parallel-size", "--max-num-seqs", "--max-model-len", "--max-loras"):
        p.add_argument(flag, type=int)
    p.add_argument("--block-size", type=int, choices=BLOCK_SIZES[target])
    p.add_argument("--enable-lora", action="store_true")
    p.add_argument("--max-lora-rank", type=int, choices=None if target == "vllm-v0-fork" else LORA_RANKS)
    p.add_argument("--quantization")
    if target in ("vllm-v0", "vllm-v0-fork"):
        p.add_argument("--device", choices=["auto", "cuda", "neuron", "cpu", "tpu", "xpu", "hpu"])
        p.add_argument("--override-neuron-config", type=json.loads)
    else:  # V1 (vLLM 0.13 / 0.16): no --device, no --override-neuron-config
        p.add_argument("--additional-config", type=json.loads)
        p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
        p.add_argument("--num-gpu-blocks-override", type=int)
    if target == "vllm-v0-fork":
        p.add_argument("--speculative-model")
        p.add_argument("--num-speculative-tokens", type=int)
    else:
        p.add_argument("--speculative-config", type=json.loads)
    # tool calling (every target's OpenAI server, vLLM >= 0.6): --tool-call-parser takes any string (a metavar, no
    # choices); validate_parsed_serve_args (entrypoints/openai/cli_args.py) refuses auto tool choice without a
    # parser, and validate_api_server_args (entrypoints/openai/api_server.py) a name the registry lacks, at start
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument("--tool-call-parser")
    args = p.parse_args(argv)
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise ParseError("--enable-auto-tool-choice requires --tool-call-parser")
    if args.enable_auto_tool_choice and args.tool_call_parser not in TOOL_PARSERS[target]:
        raise ParseError(f"invalid tool call parser: {args.tool_call_parser}")
    return args
