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
    # tool calling (every target's OpenAI server, vLLM >= 0.6): the parser name is checked against vLLM's registry
    # at start; validate_parsed_serve_args refuses auto tool choice without a parser
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument("--tool-call-parser")
    args = p.parse_args(argv)
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise ParseError("--enable-auto-tool-choice requires --tool-call-parser")
    return args
