"""The checks a loaded portable artifact makes on what a caller asks of it (``CompiledLM``'s prefill / decode /
verify arguments) before anything runs: the bounds it was compiled for, as one frozen ``StepBounds``.

A request outside a compiled bound (a prompt longer than the largest context bucket, a position past the sequence
length) is a ``BucketError`` the engine reports to the client; a malformed call (slots repeated, lengths that do not
match) is a ``ValueError``: a bug of the caller.

Example::

    bounds = StepBounds.for_config(config)
    bounds.prefill([0], [[1, 42, 7]])
    tokens, positions = bounds.decode([5], [3], [0])      # int64 tensors, one per slot
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from neuronpack.errors import BucketError

if TYPE_CHECKING:
    from neuronpack.backends.torch_aot.artifact_config import ArtifactConfig


@dataclass(frozen=True)
class StepBounds:
    batch_size: int
    context_buckets: tuple[int, ...]
    token_generation_buckets: tuple[int, ...]
    max_seq_len: int
    max_verify_tokens: int  # tokens per row one step may run
    num_layers: int
    adapter_names: tuple[str, ...]  # LoRA adapters in slot order

    @classmethod
    def for_config(cls, config: ArtifactConfig) -> StepBounds:
        return cls(config.batch_size, config.context_encoding_buckets, config.token_generation_buckets,
                   config.seq_len, config.max_step_tokens, config.num_layers, config.adapter_names)

    def prefill(self, slots: Sequence[int], prompts: Sequence[Sequence[int]],
                starts: Sequence[int] | None = None) -> None:
        """``starts``: each prompt's first position (prefix caching, chunked prefill); every row runs the longest
        prompt's width (right padded), so each start + that width must stay within the sequence length."""
        if starts is not None:
            longest = max((len(p) for p in prompts), default=0)
            if len(starts) != len(prompts) or any(s < 0 for s in starts):
                raise ValueError(f"prefill needs one start >= 0 per prompt, got {list(starts)}")
            if max(starts, default=0) + longest > self.max_seq_len:
                raise BucketError(f"prefill from position {max(starts)} of {longest} tokens passes the compiled "
                                  f"sequence length {self.max_seq_len}", where="prefill starts",
                                  fix="stop the sequence at max_seq_len or compile with a larger seq_len")
        if len(slots) != len(prompts) or not slots:
            raise ValueError(f"prefill needs one slot per prompt, got {len(slots)} slots and {len(prompts)} prompts")
        if len(set(slots)) != len(slots) or not all(0 <= s < self.batch_size for s in slots):
            raise ValueError(f"slots {list(slots)} must be distinct and in 0..{self.batch_size - 1}")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("prefill prompts must not be empty")
        longest = max(len(p) for p in prompts)
        if longest > self.context_buckets[-1]:
            raise BucketError(f"prompt of {longest} tokens exceeds the largest context bucket "
                              f"{self.context_buckets[-1]}", where=f"context buckets {list(self.context_buckets)}",
                              fix="shorten the prompt or compile with a larger max_context_length")

    def decode(self, tokens, positions, slots: list[int]):
        """-> (tokens, positions) as flat int64 tensors, one per slot."""
        import torch

        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        positions = torch.as_tensor(positions, dtype=torch.long).reshape(-1)
        if not slots or len(set(slots)) != len(slots) or not all(0 <= s < self.batch_size for s in slots):
            raise ValueError(f"decode slots {slots} must be distinct and in 0..{self.batch_size - 1}")
        if tokens.numel() != len(slots) or positions.numel() != len(slots):
            raise ValueError(f"decode needs {len(slots)} tokens and positions (one per slot), got "
                             f"{tokens.numel()} and {positions.numel()}")
        where = positions.tolist()
        if min(where) < 0 or max(where) >= self.max_seq_len:
            raise BucketError(f"position {max(where)} is outside the compiled sequence length "
                              f"{self.max_seq_len}", where=f"token generation buckets "
                              f"{list(self.token_generation_buckets)}",
                              fix="stop the sequence at max_seq_len or compile with a larger seq_len")
        return tokens, positions

    def verify(self, slots: list[int], token_rows: Sequence[Sequence[int]], starts: Sequence[int]):
        """-> (tokens [n, T], starts [n]) as int64 tensors."""
        import torch

        width = len(token_rows[0]) if token_rows else 0
        if len(token_rows) != len(slots) or any(len(r) != width for r in token_rows) or width == 0:
            raise ValueError(f"verify needs one non-empty token row per slot, all of one length, got "
                             f"{[len(r) for r in token_rows]} for {len(slots)} slots")
        if width > self.max_verify_tokens:
            raise ValueError(f"verify of {width} tokens per row, but this artifact's step runs at most "
                             f"{self.max_verify_tokens}")
        tokens = torch.tensor([list(r) for r in token_rows], dtype=torch.long)
        positions = torch.as_tensor(list(starts), dtype=torch.long)
        self.decode(tokens[:, 0], positions + (width - 1), slots)
        return tokens, positions

    def hidden_layers(self, hidden_layers: Sequence[int] | None) -> tuple[int, ...] | None:
        if hidden_layers is None:
            return None
        layers = tuple(int(i) for i in hidden_layers)
        if not layers or not all(0 <= i < self.num_layers for i in layers):
            raise ValueError(f"hidden_layers {list(layers)} must name layers in 0..{self.num_layers - 1}")
        return layers

    def adapters(self, adapters: Sequence[int] | None, n: int) -> list[int] | None:
        """``adapters`` as ints, checked: one per row, each 0 (none) or an adapter's index."""
        if adapters is None:
            return None
        adapters = [int(a) for a in adapters]
        if len(adapters) != n:
            raise ValueError(f"{n} rows need {n} adapter indices, got {len(adapters)}")
        if not all(0 <= a <= len(self.adapter_names) for a in adapters):
            raise ValueError(f"adapter indices {adapters} must be in 0..{len(self.adapter_names)} (0: none; "
                             f"this artifact's adapters: {', '.join(self.adapter_names) or 'none'})")
        return adapters
