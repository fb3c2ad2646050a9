"""What the mixture-of-experts families share (families/qwen3_moe.py, mixtral.py, gpt_oss.py): a ``MoeFamily`` mixin
that builds a ``SparseMoE`` FFN for each "moe" layer (models/moe.py), finds the format the checkpoint holds the
experts in, assembles each layer's stacked experts from whatever layout the checkpoint has (models/moe_checkpoint.py)
and names the router's checkpoint tensor where it differs from ours.

A family sets ``expert_names`` (its per-expert linears, gpt-oss's fused layout), ``blocks`` (the checkpoint's module
names of an MoE block, tried in order: Mixtral's ``block_sparse_moe``, then ``mlp``) and ``router`` (``gate`` or
``router``); the model's own block is always ``model.layers.<i>.mlp``.

Example::

    class Qwen3MoeFamily(MoeFamily, Qwen3Family): ...     # MoeFamily first: its ffn / checkpoint hooks win
"""

from __future__ import annotations

import dataclasses
from typing import Any

from neuronpack.models.config import ModelConfig
from neuronpack.models.moe_config import MOE, ExpertNames


class MoeFamily:
    """The MoE hooks of a family (a mixin before the family it extends)."""

    blocks: tuple[str, ...] = ("mlp",)
    router = "gate"
    expert_names: ExpertNames | None = None  # None: the defaults (gate_proj, up_proj, down_proj)

    def moe_layers(self, cfg: ModelConfig) -> list[int]:
        return [i for i in range(cfg.num_layers) if cfg.ffn_kind(i) == MOE]

    def ffn(self, cfg: ModelConfig, index: int, int8: frozenset[str]):
        if cfg.ffn_kind(index) != MOE:
            return super().ffn(cfg, index, int8)
        from neuronpack.models.moe import SparseMoE

        return SparseMoE(cfg, f"model.layers.{index}.mlp", int8, self.router)

    def checkpoint_config(self, cfg: ModelConfig, ckpt) -> ModelConfig:
        from neuronpack.models.moe_checkpoint import expert_format

        layers = self.moe_layers(cfg)
        if not layers:
            return cfg
        fmt = expert_format(ckpt, self._prefixes(layers[0]), self._names())
        return dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, expert_format=fmt))

    def checkpoint_tensors(self, ckpt, cfg: ModelConfig, dtype) -> dict:
        from neuronpack.models.moe_checkpoint import read_experts

        out = {}
        for i in self.moe_layers(cfg):
            for name, t in read_experts(ckpt, self._prefixes(i), self._names(), dtype).items():
                out[f"model.layers.{i}.mlp.experts.{name}"] = t
        return out

    def checkpoint_names(self, names: set[str]) -> dict[str, str]:
        """The router's tensors where the checkpoint keeps them under another block name (Mixtral)."""
        out = {}
        for name in names:
            for block in self.blocks:
                marker = f".{block}.{self.router}."
                if block != "mlp" and marker in name:
                    out[name.replace(marker, f".mlp.{self.router}.")] = name
        return out

    def ffn_types(self, hf: dict[str, Any], layers: int) -> tuple[str, ...]:
        """Every layer a MoE layer (Qwen3-MoE overrides: some layers dense)."""
        return (MOE,) * layers

    def _prefixes(self, index: int) -> list[str]:
        return [f"model.layers.{index}.{block}" for block in (*self.blocks, "mlp")]

    def _names(self) -> ExpertNames:
        return self.expert_names or ExpertNames()
