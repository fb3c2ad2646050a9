"""The model runner on a recording stand-in model: a plan's row copies reach the target's cache and the draft's,
prompts share one prefill call (prompt-logprob prompts take their own), fork copies follow their leader's prefill,
and a failed call becomes that group's error."""

from __future__ import annotations

import pytest
import torch

from neuronpack.runtime.engine.kv_rows import RowCopy
from neuronpack.runtime.engine.plan import DecodeRow, PrefillGroup
from neuronpack.runtime.engine.runner import ModelRunner

VOCAB = 11


class RecordingModel:
    """Logits that say which row ran: row r's last-position logits are r at every token."""

    adapter_names = ()
    context_buckets = (4, 8)  # one prefill call takes at most 8 tokens per row
    max_seq_len = 32

    def __init__(self, fail_prefill: bool = False) -> None:
        self.calls: list[tuple] = []
        self.fail_prefill = fail_prefill

    def prefill(self, slots, prompts, **kwargs):
        call = ("prefill", list(slots), [list(p) for p in prompts])
        self.calls.append((*call, kwargs["starts"]) if "starts" in kwargs else call)
        if self.fail_prefill:
            raise RuntimeError("out of memory")
        return torch.tensor([[float(s)] * VOCAB for s in slots])

    def prefill_hidden(self, slots, prompts, hidden_layers=None, **kwargs):
        self.calls.append(("prefill_hidden", list(slots), hidden_layers))
        width = max(len(p) for p in prompts)
        hidden = torch.arange(float(len(slots) * width)).view(len(slots), width, 1)
        return self.prefill(slots, prompts, **kwargs), hidden

    def prompt_logits(self, token_ids, slot=0, **kwargs):
        self.calls.append(("prompt_logits", slot, list(token_ids), kwargs.get("start", 0)))
        return torch.arange(len(token_ids), dtype=torch.float32)[:, None].expand(-1, VOCAB)

    def decode(self, tokens, positions, slots=None, **kwargs):
        self.calls.append(("decode", tokens.tolist(), positions.tolist(), list(slots)))
        return torch.zeros(len(slots), VOCAB)

    def copy_rows(self, copies):
        self.calls.append(("copy_rows", list(copies)))


class RecordingProposer:
    needs_hidden_states = False
    hidden_layers = None

    def __init__(self) -> None:
        self.copies: list = []

    def copy_rows(self, copies):
        self.copies.extend(copies)


class HiddenProposer(RecordingProposer):
    needs_hidden_states = True
    hidden_layers = (0, 2)

    def __init__(self) -> None:
        super().__init__()
        self.hidden: dict = {}

    def prefilled(self, request_ids, hidden):
        self.hidden.update(zip(request_ids, hidden, strict=True))


class Speculator:
    def __init__(self, proposer=None) -> None:
        self.proposer = proposer or RecordingProposer()


def test_moves_reach_the_target_and_the_draft_cache():
    model, spec = RecordingModel(), Speculator()
    runner = ModelRunner(model, spec)
    runner.move_rows(())
    runner.move_rows((RowCopy(3, 1, 17),))
    assert model.calls == [("copy_rows", [RowCopy(3, 1, 17)])] and spec.proposer.copies == [RowCopy(3, 1, 17)]


def test_prefill_shares_one_call_and_copies_forks_after_it():
    model = RecordingModel()
    groups = (PrefillGroup("a", 2, [1, 2, 3], fork_copies=(RowCopy(2, 3, 3),)),
              PrefillGroup("echo", 0, [4, 5], own_call=True), PrefillGroup("b", 1, [6]))
    out = ModelRunner(model).prefill(groups)
    assert model.calls == [("prefill", [2, 1], [[1, 2, 3], [6]]), ("copy_rows", [RowCopy(2, 3, 3)]),
                           ("prompt_logits", 0, [4, 5], 0)]
    assert out["a"].logits.shape == (1, VOCAB) and float(out["a"].logits[0, 0]) == 2.0
    assert out["echo"].all_logits.shape == (2, VOCAB) and float(out["echo"].logits[0, 0]) == 1.0
    assert all(o.error is None for o in out.values())


def test_a_failed_shared_prefill_is_every_sharing_groups_error():
    out = ModelRunner(RecordingModel(fail_prefill=True)).prefill((PrefillGroup("a", 0, [1]),
                                                                  PrefillGroup("b", 1, [2])))
    assert [type(o.error) for o in out.values()] == [RuntimeError, RuntimeError] and out["a"].logits is None


def test_decode_runs_the_plans_rows_in_order():
    model = RecordingModel()
    logits = ModelRunner(model).decode((DecodeRow("a", 0, 42, 7), DecodeRow("b", 1, 43, 3)))
    assert logits.shape == (2, VOCAB) and model.calls == [("decode", [42, 43], [7, 3], [0, 1])]
    with pytest.raises(RuntimeError, match="no speculative step"):
        ModelRunner(model).speculate([])


def test_a_proposer_that_reads_hidden_states_gets_each_prompts_own_rows():
    model, spec = RecordingModel(), Speculator(HiddenProposer())
    out = ModelRunner(model, spec).prefill((PrefillGroup("a", 0, [1, 2, 3]), PrefillGroup("b", 1, [4])))
    assert model.calls[0] == ("prefill_hidden", [0, 1], (0, 2))
    assert spec.proposer.hidden["a"].flatten().tolist() == [0.0, 1.0, 2.0]
    assert spec.proposer.hidden["b"].flatten().tolist() == [3.0]
    assert float(out["b"].logits[0, 0]) == 1.0


def test_cached_prompts_start_late_and_chunks_share_one_call():
    """A group prefills its chunk, positions start..stop-1 (prefix caching, earlier chunks); the chunks share one
    call, and a row whose start + the call's width would pass the sequence length (32) goes alone. Only a prompt's
    last chunk has logits; a prompt-logprobs prompt's chunks give every position's logits once its last one ran."""
    model = RecordingModel()
    runner = ModelRunner(model)
    groups = (PrefillGroup("cached", 0, list(range(10)), start=7), PrefillGroup("fresh", 1, [1, 2]),
              PrefillGroup("long", 2, list(range(20)), start=2, end=10),
              PrefillGroup("late", 3, list(range(31)), start=30),
              PrefillGroup("echo", 4, list(range(10)), own_call=True, end=8),
              PrefillGroup("scored", 5, [1, 2], scoring_only=True, fork_copies=(RowCopy(5, 6, 2),)))
    out = runner.prefill(groups)
    assert model.calls == [
        ("prefill", [0, 1, 2, 5], [[7, 8, 9], [1, 2], list(range(2, 10)), [1, 2]], [7, 0, 2, 0]),  # width 8
        ("prefill", [3], [[30]], [30]),  # 30 + 8 would pass 32
        ("prompt_logits", 4, list(range(8)), 0)]  # no copy for a scoring group
    assert not out["long"].done and out["long"].logits is None and not out["echo"].done
    assert float(out["late"].logits[0, 0]) == 3.0 and all(o.error is None for o in out.values())
    out = runner.prefill((PrefillGroup("echo", 4, list(range(10)), own_call=True, start=8, first=False),))
    assert model.calls[-1] == ("prompt_logits", 4, [8, 9], 8)
    assert out["echo"].done and out["echo"].all_logits.shape == (10, VOCAB)


def test_a_chunked_prompts_hidden_states_reach_the_proposer_whole():
    model, spec = RecordingModel(), Speculator(HiddenProposer())
    runner = ModelRunner(model, spec)
    runner.prefill((PrefillGroup("long", 0, list(range(12)), end=8),))
    assert "long" not in spec.proposer.hidden  # not before its last chunk
    runner.prefill((PrefillGroup("long", 0, list(range(12)), start=8, first=False),))
    assert [c[0] for c in model.calls] == ["prefill_hidden", "prefill", "prefill_hidden", "prefill"]
    assert spec.proposer.hidden["long"].flatten().tolist() == [*map(float, range(8)), 0.0, 1.0, 2.0, 3.0]
