"""PEFT LoRA adapters for tests, made by PEFT itself on a tiny checkpoint (random non-zero B, so every adapter changes
tokens), and the transformers + PEFT reference (adapter merged with ``merge_and_unload``).

Example::

    adapter = make_peft_adapter(tiny_llama, tmp_path / "sql", rank=8, seed=1)
    reference = merged_reference(tiny_llama, adapter)   # a transformers model with the adapter merged in
"""

from __future__ import annotations

import json
from pathlib import Path

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def make_peft_adapter(model_dir: Path, out: Path, *, rank: int = 8, alpha: float = 16, seed: int = 1,
                      target_modules: tuple[str, ...] = ATTENTION, use_rslora: bool = False,
                      layers: list[int] | None = None, scale: float = 0.3, **config) -> Path:
    """``save_pretrained`` of a PEFT LoRA adapter on the checkpoint in ``model_dir``, A and B random (seeded).
    Extra keyword arguments go to ``LoraConfig`` (e.g. ``use_dora=True`` to make an adapter we refuse)."""
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(target_modules), use_rslora=use_rslora,
                      layers_to_transform=layers, lora_dropout=0.0, bias=config.pop("bias", "none"), **config)
    model = get_peft_model(base, lora)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    model.save_pretrained(out)
    return Path(out)


def merged_reference(model_dir: Path, adapter: Path | None):
    """The transformers model in ``model_dir`` with ``adapter`` merged (``merge_and_unload``); plain without one."""
    import torch
    import transformers
    from peft import PeftModel

    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if adapter is None:
        return base
    return PeftModel.from_pretrained(base, adapter).merge_and_unload().eval()


def greedy_reference(model, prompt: list[int], max_new: int, eos: int | None = None) -> list[int]:
    """Greedy continuation by transformers (one full forward per token), ending after ``eos`` when given (as the
    engine does)."""
    import torch

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(max_new):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
            if ids[-1] == eos:
                break
    return ids[len(prompt):]


def edit_adapter_config(adapter: Path, **changes) -> None:
    """Change keys of an adapter's adapter_config.json in place (a test's own copy)."""
    path = Path(adapter) / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
