"""bench/peers.py's inputs: SmolLM2-135M-Instruct (real weights) or a random-weight model of SmolLM2-1.7B's shape
with SmolLM2's tokenizer, llama.cpp's GGUFs of it, each precision's batch-1 artifact, and the bytes a decode step
reads.

A random model is enough where bandwidth and compute decide (time to first token, decode speed); its greedy tokens
say nothing about quality. It is written as a bfloat16 checkpoint (as most modern checkpoints are), one safetensors
shard per layer, so making it never holds more than a layer in float32.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

# SmolLM2-1.7B-Instruct's config.json (the architecture; the weights are random)
SMOLLM2_1_7B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 49152,
    "max_position_embeddings": 8192, "rope_theta": 130000, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "torch_dtype": "bfloat16",
    "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02,
}
SHAPES = {"smollm2-135m": None, "smollm2-1.7b": SMOLLM2_1_7B}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "chat_template.jinja")
# precision -> (compute dtype of the artifact, int8 weights, llama.cpp GGUF of equal weight bytes, transformers dtype)
PRECISIONS = {
    "float32": ("float32", False, "f32", "float32"),
    "bfloat16": ("bfloat16", False, "bf16", "bfloat16"),
    "int8": ("float32", True, "q8_0", "float32"),  # int8 weights, float32 compute
    "int8-bf16": ("bfloat16", True, "q8_0", "bfloat16"),  # int8 weights, bfloat16 compute
}


def random_checkpoint(config: dict, tokenizer_dir: Path, out: Path, seed: int = 0) -> Path:
    """A bfloat16 checkpoint of ``config`` in ``out``: weights ~ N(0, initializer_range), norms 1, the tokenizer
    files of ``tokenizer_dir`` (reused when complete)."""
    import torch

    if (out / "model.safetensors.index.json").is_file():
        return out
    gen = torch.Generator().manual_seed(seed)
    h, i, std = config["hidden_size"], config["intermediate_size"], config["initializer_range"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = h // heads

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).bfloat16()

    shards = [("embed", {"model.embed_tokens.weight": normal(config["vocab_size"], h),
                         "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)})]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shards.append((f"layer{layer:02d}", {
            p + "self_attn.q_proj.weight": normal(heads * hd, h), p + "self_attn.k_proj.weight": normal(kv * hd, h),
            p + "self_attn.v_proj.weight": normal(kv * hd, h), p + "self_attn.o_proj.weight": normal(h, heads * hd),
            p + "mlp.gate_proj.weight": normal(i, h), p + "mlp.up_proj.weight": normal(i, h),
            p + "mlp.down_proj.weight": normal(h, i),
            p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16)}))
    return write_checkpoint(out, len(shards), iter(shards), config, tokenizer_dir)


def write_checkpoint(out: Path, count: int, shards, config: dict, tokenizer_dir: Path) -> Path:
    """``count`` shards, each (name, tensors) from the iterator ``shards`` (made one at a time: only one in memory),
    as model-<n>-of-<count>-<name>.safetensors with their index, config.json and ``tokenizer_dir``'s tokenizer
    files, written into ``out``.partial, then renamed to ``out``."""
    from safetensors.torch import save_file

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    index = {}
    for n, (name, tensors) in enumerate(shards):
        file = f"model-{n + 1:05d}-of-{count:05d}-{name}.safetensors"
        save_file(tensors, str(tmp / file), metadata={"format": "pt"})
        index.update(dict.fromkeys(tensors, file))
        del tensors
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, tmp / name)
    (tmp / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}, indent=2))
    tmp.rename(out)
    return out


def make_ggufs(model_dir: Path, llama_src: Path, python: str, out: Path, kinds: set[str]) -> dict[str, dict]:
    """The GGUFs of ``kinds`` (f32, bf16, q8_0 by llama.cpp's converter; q4_k_m quantized from f32 by
    ``llama_model_quantize``) of ``model_dir``; returns {type: {"path", "how", "bytes", "step_bytes"}} (reused when
    present)."""
    out.mkdir(parents=True, exist_ok=True)
    made = {}
    # the converter imports sentencepiece even for a BPE tokenizer: put it on PYTHONPATH (``pip install --target``)
    extra = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(llama_src / "gguf-py"), *([extra] if extra else [])])}
    for outtype in [k for k in ("f32", "bf16", "q8_0") if k in kinds or (k == "f32" and "q4_k_m" in kinds)]:
        path = out / f"{model_dir.name}-{outtype.upper()}.gguf"
        argv = [sys.executable, str(llama_src / "convert_hf_to_gguf.py"), str(model_dir), "--outtype", outtype,
                "--outfile", str(path)]
        if not path.is_file():
            subprocess.run(argv, env=env, check=True, capture_output=True)
        made[outtype] = {"path": str(path), "how": f"PYTHONPATH={env['PYTHONPATH']} python "
                                                   f"{' '.join(argv[1:])}"}
    if "q4_k_m" in kinds:
        path = out / f"{model_dir.name}-Q4_K_M.gguf"
        code = ("import sys, llama_cpp; p = llama_cpp.llama_model_quantize_default_params(); "
                "p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M; p.nthread = 2; "
                "sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))")
        if not path.is_file():
            subprocess.run([python, "-c", code, made["f32"]["path"], str(path)], check=True, capture_output=True)
        made["q4_k_m"] = {"path": str(path), "how": f"llama_cpp.llama_model_quantize(F32 file, {path.name}, "
                                                    "ftype=LLAMA_FTYPE_MOSTLY_Q4_K_M)"}
    for entry in made.values():
        entry["bytes"] = Path(entry["path"]).stat().st_size
        entry["step_bytes"] = gguf_step_bytes(Path(entry["path"]))
    return {k: v for k, v in made.items() if k in kinds}


def int8_checkpoint(model_dir: Path, workdir: Path) -> Path:
    """``neuronpack quantize --dtype int8 --include-lm-head`` of ``model_dir`` (the tied head quantized too: Q8_0
    quantizes its output matrix as well, so the bytes stay equal), reused when present."""
    from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint

    out = workdir / f"{model_dir.name}-int8-head"
    if not (out / "config.json").is_file():
        quantize_checkpoint(model_dir, out, QuantizeOptions("int8", include_lm_head=True))
    return out


def build_precision(model_dir: Path, precision: str, workdir: Path, *, seq_len: int, max_context: int) -> Path:
    """The batch-1 artifact of ``precision`` (a PRECISIONS key) in ``workdir`` (built, or reused when present)."""
    from bench._common import build_artifact

    compute, int8, _, _ = PRECISIONS[precision]
    source = int8_checkpoint(model_dir, workdir) if int8 else model_dir
    return build_artifact(source, compute, workdir / f"artifact-{precision}-b1-{max_context}", batch=1,
                          seq_len=seq_len, max_context=max_context)


def artifact_step_bytes(artifact: Path) -> int:
    """Weight bytes a decode step reads from an artifact: every tensor of its safetensors files but the embedding
    table (one row per token), unless the head is that table (tied)."""
    from safetensors import safe_open

    sizes = {}
    for file in sorted(artifact.rglob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                sl = f.get_slice(name)
                sizes[name] = _numel(sl.get_shape()) * _DTYPE_BYTES[sl.get_dtype()]
    if any(name.endswith("lm_head.weight") for name in sizes):
        sizes = {n: b for n, b in sizes.items() if not n.endswith("embed_tokens.weight")}
    return sum(sizes.values())


def gguf_step_bytes(path: Path) -> int:
    """The same for a GGUF file: every tensor but ``token_embd.weight`` unless there is no ``output.weight``."""
    from gguf import GGUFReader

    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(str(path)).tensors}
    if "output.weight" in tensors:
        tensors.pop("token_embd.weight", None)
    return sum(tensors.values())


_DTYPE_BYTES = {"F32": 4, "BF16": 2, "F16": 2, "I8": 1, "U8": 1, "F8_E4M3": 1, "I32": 4, "I64": 8}


def _numel(shape: list[int]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out
