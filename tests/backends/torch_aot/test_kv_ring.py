"""Sliding-window layers that keep only their window: a ``KvCache`` ring of ``window + k`` positions per row, read
by ``forward_step(ring=...)``, gives the logits of the cache-free forward at every step: a right-padded prefill
longer than the ring, a chunk continuing it, decode steps, and a verify step whose rejected tokens the next steps
must not see (the k spare positions)."""

from __future__ import annotations

import pytest
import torch

from neuronpack.backends.torch_aot.kv_cache import KvCache
from neuronpack.models import load_model
from neuronpack.models.config import SLIDING

SPARE = 3  # a verify step's draft length: positions it may write past what is kept


@pytest.mark.parametrize(("arch", "overrides"), [("gemma3", None), ("mistral", {"sliding_window": 8})])
def test_ring_steps_match_the_full_forward(make_checkpoint, arch, overrides):
    """Gemma 3 (sliding layers and a global one) and Mistral (every layer a sliding window: no full layers left)."""
    model = load_model(make_checkpoint(arch, overrides=overrides), torch.float32)
    cfg = model.config
    ring = cfg.sliding_window + SPARE
    sliding = [i for i in range(cfg.num_layers) if cfg.layer_kind(i) == SLIDING]
    cache = KvCache((cfg.num_layers, 2, cfg.num_kv_heads, 41, cfg.head_dim), torch.float32, sliding, ring)
    assert cache.ring_k.shape[3] == ring + 1 and cache.k.shape[0] == cfg.num_layers - len(sliding)
    seq = torch.randint(3, 384, (1, 34), generator=torch.Generator().manual_seed(4))[0].tolist()
    with torch.no_grad():
        full = model.forward_full(torch.tensor([seq]))[0]  # [34, vocab]

        def step(tokens, start, lengths=None, index=(0,)):
            rows, starts = torch.tensor([1]), torch.tensor([start])
            k, v = cache.gathered([1])
            logits, _, new_k, new_v = model.forward_step(torch.tensor([tokens]), starts, max(1, start), k, v,
                                                         torch.tensor([list(index)]), ring=ring)
            cache.store(rows, starts, new_k, new_v, lengths)
            return logits[0]

        prompt = seq[:20]  # longer than the ring: only its last 11 positions are kept
        padded = step([*prompt, 0, 0, 0, 0], 0, lengths=[20], index=[19])  # padding must not reach the ring
        torch.testing.assert_close(padded[0], full[19], atol=1e-4, rtol=1e-4)
        chunk = step(seq[20:24], 20, index=range(4))  # a chunk after it
        torch.testing.assert_close(chunk, full[20:24], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(step([seq[24]], 24)[0], full[24], atol=1e-4, rtol=1e-4)
        drafts = [seq[25], 1, 2, 3]  # a verify step: the first token right, three rejected drafts written too
        torch.testing.assert_close(step(drafts, 25)[0], full[25], atol=1e-4, rtol=1e-4)
        for pos in range(26, 34):  # decoding on from position 26 overwrites the rejected ones one by one
            torch.testing.assert_close(step([seq[pos]], pos)[0], full[pos], atol=1e-4, rtol=1e-4)
    assert cache.k[:, 0].abs().sum() == 0 and cache.ring_k[:, 0].abs().sum() == 0  # the idle row untouched
