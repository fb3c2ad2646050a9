"""Tiny EAGLE drafts written with the exact tensor names of the public originals (SafeAILab/EAGLE).

EAGLE-1/2 drafts: ``embed_tokens.weight``, ``fc.weight`` [H, 2H] (+ ``fc.bias`` when config ``bias`` is true), one
decoder layer ``layers.0.*`` without ``input_layernorm``, no ``norm``, no ``lm_head``. EAGLE-3 drafts: ``d2t``
[draft_vocab] int64, ``t2d`` [vocab] bool, ``fc.weight`` [H, 3H], ``midlayer.*`` (with hidden_norm and
input_layernorm; q/k/v_proj take 2H inputs: [embedding, hidden]), ``norm.weight``, their own ``lm_head.weight``
[draft_vocab, H], no ``embed_tokens``.

The files are written with torch.save / safetensors directly (not with neuronpack's writer) so the tests compare
neuronpack's output with inputs it did not produce.

Example::

    draft = make_eagle1_draft(tmp_path / "draft", hidden=64, vocab=384, layout="bin")
    target = make_checkpoint("llama")                      # from tests/conftest.py (hidden 64)
"""

from __future__ import annotations

import json
from pathlib import Path

# Draft layer shape: the tiny targets in tests/helpers/tiny_models.py have hidden 64 (48 for smollm), 4 heads / 2 KV.
HEADS, KV_HEADS, INTERMEDIATE = 4, 2, 96


def eagle1_tensors(hidden: int, vocab: int, *, fc_bias: bool, dtype, input_norm: bool = False,
                   head: bool = False, seed: int = 1) -> dict:
    """{name: tensor} of an EAGLE-1/2 draft (one decoder layer) with the real tensor names."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    head_dim = hidden // HEADS
    shapes = {
        "embed_tokens.weight": (vocab, hidden),
        "fc.weight": (hidden, 2 * hidden),
        **layer_shapes("layers.0", hidden, head_dim),
        "layers.0.post_attention_layernorm.weight": (hidden,),
    }
    if fc_bias:
        shapes["fc.bias"] = (hidden,)
    if input_norm:
        shapes["layers.0.input_layernorm.weight"] = (hidden,)
    if head:
        shapes["lm_head.weight"] = (vocab, hidden)
    return {name: torch.randn(shape, generator=gen).to(dtype) for name, shape in shapes.items()}


def eagle3_tensors(hidden: int, vocab: int, draft_vocab: int, *, dtype, seed: int = 3) -> dict:
    """{name: tensor} of an original EAGLE-3 draft: midlayer.*, d2t/t2d, fc [H, 3H], its own lm_head, no embed."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    head_dim = hidden // HEADS
    shapes = {
        "fc.weight": (hidden, 3 * hidden),
        **layer_shapes("midlayer", hidden, head_dim, attn_in=2 * hidden),
        "midlayer.hidden_norm.weight": (hidden,),
        "midlayer.input_layernorm.weight": (hidden,),
        "midlayer.post_attention_layernorm.weight": (hidden,),
        "norm.weight": (hidden,),
        "lm_head.weight": (draft_vocab, hidden),
    }
    tensors = {name: torch.randn(shape, generator=gen).to(dtype) for name, shape in shapes.items()}
    # d2t: offset from a draft token id to its target id; t2d: which target ids the draft vocabulary keeps.
    kept = torch.randperm(vocab, generator=gen)[:draft_vocab].sort().values
    tensors["d2t"] = kept - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[kept] = True
    tensors["t2d"] = t2d
    return tensors


def layer_shapes(prefix: str, hidden: int, head_dim: int, attn_in: int | None = None, *, heads: int = HEADS,
                 kv_heads: int = KV_HEADS, intermediate: int = INTERMEDIATE) -> dict:
    """{name: shape} of a draft decoder layer's projections (``attn_in``: q/k/v input width, 2H in EAGLE-3)."""
    attn_in = attn_in or hidden
    return {
        f"{prefix}.self_attn.q_proj.weight": (heads * head_dim, attn_in),
        f"{prefix}.self_attn.k_proj.weight": (kv_heads * head_dim, attn_in),
        f"{prefix}.self_attn.v_proj.weight": (kv_heads * head_dim, attn_in),
        f"{prefix}.self_attn.o_proj.weight": (hidden, heads * head_dim),
        f"{prefix}.mlp.gate_proj.weight": (intermediate, hidden),
        f"{prefix}.mlp.up_proj.weight": (intermediate, hidden),
        f"{prefix}.mlp.down_proj.weight": (hidden, intermediate),
    }


def draft_config(hidden: int, vocab: int, *, dtype: str, eagle3: bool = False, bias: bool | None = None,
                 draft_vocab: int | None = None) -> dict:
    """config.json in the style of the EAGLE originals (a one-layer Llama config, EAGLE's own ``bias`` key)."""
    config = {
        "architectures": ["LlamaForCausalLMEagle3" if eagle3 else "LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": 1,
        "vocab_size": vocab,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "torch_dtype": dtype,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if bias is not None:
        config["bias"] = bias
    if eagle3:
        config["draft_vocab_size"] = draft_vocab
    return config


def write_draft(out: Path, tensors: dict, config: dict, *, layout: str) -> Path:
    """Write ``tensors`` as ``layout``: "bin", "bin-sharded", "safetensors" or "safetensors-sharded"."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    names = list(tensors)
    if layout == "bin":
        _save_bin(out / "pytorch_model.bin", tensors)
    elif layout == "safetensors":
        _save_st(out / "model.safetensors", tensors)
    elif layout in ("bin-sharded", "safetensors-sharded"):
        half = len(names) // 2
        parts = [names[:half], names[half:]]
        ext, stem, save = (
            ("bin", "pytorch_model", _save_bin) if layout == "bin-sharded" else ("safetensors", "model", _save_st)
        )
        weight_map = {}
        for i, part in enumerate(parts, start=1):
            fname = f"{stem}-{i:05d}-of-{len(parts):05d}.{ext}"
            save(out / fname, {n: tensors[n] for n in part})
            weight_map.update(dict.fromkeys(part, fname))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / f"{stem}.{ext}.index.json").write_text(json.dumps(index, indent=2))
    else:
        raise ValueError(f"unknown draft layout {layout!r}")
    return out


def make_eagle1_draft(out: Path, *, hidden: int = 64, vocab: int, layout: str = "bin", fc_bias: bool = True,
                      dtype: str = "float16", input_norm: bool = False, head: bool = False,
                      config_bias: bool | None = None, seed: int = 1) -> Path:
    """An EAGLE-1/2 draft; ``config_bias`` overrides the config's ``bias`` key (default: equals ``fc_bias``)."""
    import torch

    tensors = eagle1_tensors(hidden, vocab, fc_bias=fc_bias, dtype=getattr(torch, dtype), input_norm=input_norm,
                             head=head, seed=seed)
    bias = fc_bias if config_bias is None else config_bias
    return write_draft(out, tensors, draft_config(hidden, vocab, dtype=dtype, bias=bias), layout=layout)


def make_eagle3_draft(out: Path, *, hidden: int = 64, vocab: int, draft_vocab: int | None = None,
                      layout: str = "safetensors", dtype: str = "bfloat16", seed: int = 3,
                      aux_layers: list[int] | None = None) -> Path:
    """An original EAGLE-3 draft; ``draft_vocab`` defaults to the target vocabulary (what NxDI accepts);
    ``aux_layers``: config ``eagle_aux_hidden_state_layer_ids`` (the target layers it reads; vLLM's default
    (2, L // 2, L - 3) needs a target of at least 4 layers)."""
    import torch

    draft_vocab = vocab if draft_vocab is None else draft_vocab
    tensors = eagle3_tensors(hidden, vocab, draft_vocab, dtype=getattr(torch, dtype), seed=seed)
    config = draft_config(hidden, vocab, dtype=dtype, eagle3=True, draft_vocab=draft_vocab)
    if aux_layers is not None:
        config["eagle_aux_hidden_state_layer_ids"] = aux_layers
    return write_draft(out, tensors, config, layout=layout)


def load_draft_tensors(path: Path) -> dict:
    """Every tensor of a draft written by ``write_draft`` (any layout), for comparisons."""
    import torch
    from safetensors.torch import load_file

    path = Path(path)
    tensors = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(file))
    for file in sorted(path.glob("*.bin")):
        tensors.update(torch.load(file, weights_only=True))
    return tensors


def _save_bin(path: Path, tensors: dict) -> None:
    import torch

    torch.save({name: t.contiguous() for name, t in tensors.items()}, path)


def _save_st(path: Path, tensors: dict) -> None:
    from safetensors.torch import save_file

    save_file({name: t.contiguous() for name, t in tensors.items()}, str(path), metadata={"format": "pt"})


# --- targets and helpers shared by the test modules ------------------------------------------------------------------
_TARGETS: dict[str, Path] = {}


def tiny_target(base: Path, kind: str) -> Path:
    """A real tiny transformers Llama (hidden 64) built once per session under ``base``.

    kinds: "fp32" (untied, one safetensors file), "bf16-sharded" (untied, several shards + index), "tied" (fp32,
    tie_word_embeddings: no lm_head.weight).
    """
    from tests.helpers.tiny_models import make_tiny_checkpoint

    if kind not in _TARGETS:
        options = {
            "fp32": {},
            "bf16-sharded": {"dtype": "bfloat16", "max_shard_size": "40KB"},
            "tied": {"tie": True},
        }[kind]
        _TARGETS[kind] = make_tiny_checkpoint(Path(base) / f"target-{kind}", arch="llama", seed=7, **options)
    return _TARGETS[kind]


def target_tensor(target: Path, name: str):
    """One tensor of a safetensors target, read with safetensors itself (the reference for comparisons)."""
    from safetensors import safe_open

    index = Path(target) / "model.safetensors.index.json"
    file = Path(target) / (json.loads(index.read_text())["weight_map"][name] if index.is_file() else
                           "model.safetensors")
    with safe_open(str(file), framework="pt") as fh:
        return fh.get_tensor(name)


def load_output(out: Path) -> dict:
    """Every tensor of a converted draft, loaded with safetensors (checks the index covers every shard)."""
    from safetensors.torch import load_file

    out = Path(out)
    index = out / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else [
        "model.safetensors"]
    tensors = {}
    for name in files:
        tensors.update(load_file(out / name))
    return tensors


def vocab_of(target: Path) -> int:
    return json.loads((Path(target) / "config.json").read_text())["vocab_size"]
