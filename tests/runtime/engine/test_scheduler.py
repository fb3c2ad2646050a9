"""Scheduling without a model and without torch: the plans ``SlotScheduler`` emits (admission, fork groups,
the prefill token budget, aborts / timeouts freeing rows, the speculation lookahead) and the ``RowAllocator`` they
come from."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from neuronpack.runtime.engine.kv_rows import RowAllocator, RowCopy
from neuronpack.runtime.engine.plan import DecodeRow, PrefillGroup, StepPlan
from neuronpack.runtime.engine.scheduler import SlotScheduler
from tests.helpers.fresh_interpreter import run_fresh


@dataclass(eq=False)
class Seq:
    """A sequence as the scheduler sees it (what the engine's RequestState answers)."""

    request_id: str
    prompt_ids: list[int] = field(default_factory=lambda: [5, 6, 7])
    output: list[int] = field(default_factory=list)
    max_tokens: int = 8
    max_model_len: int = 128
    adapter: int = 0
    prompt_logprobs: int | None = None
    forks: list = field(default_factory=list)
    num_cached_tokens: int = 0

    @property
    def last_token(self) -> int:
        return self.output[-1]

    @property
    def next_position(self) -> int:
        return len(self.prompt_ids) + len(self.output) - 1

    @property
    def room(self) -> int:
        return min(self.max_tokens - len(self.output), self.max_model_len - len(self.prompt_ids) - len(self.output))

    @property
    def scoring_only(self) -> bool:
        return self.max_tokens == 0


def prefilled(plan: StepPlan, sched: SlotScheduler, token: int = 40) -> None:
    """What the engine does with a prefill plan's outputs: every member samples its first token."""
    for group in plan.prefills:
        for row in group.rows:
            sched.at(row).output.append(token)


def test_the_scheduler_and_its_plans_import_no_torch():
    _, torch_imported = run_fresh("import neuronpack.runtime.engine.scheduler, neuronpack.runtime.engine.runner")
    assert not torch_imported


def test_admission_is_fifo_into_the_lowest_free_rows():
    sched = SlotScheduler(batch_size=3)
    seqs = [Seq(f"r{i}") for i in range(5)]
    for seq in seqs:
        sched.add(seq)
    plan = sched.schedule_prefills(limit=2)
    assert plan == StepPlan(prefills=(PrefillGroup("r0", 0, seqs[0].prompt_ids), PrefillGroup("r1", 1,
                                                                                                 seqs[1].prompt_ids)))
    prefilled(plan, sched)
    assert [g.request_id for g in sched.schedule_prefills(limit=5).prefills] == ["r2"]  # only one row left
    assert sched.free_rows == 0 and list(sched.waiting) == seqs[3:]


def test_the_decoding_rows_are_packed_into_the_cheapest_window():
    """A decode step runs on one window of adjacent rows: a row freed at its edge moves nothing; a hole inside it
    moves whichever side copies fewer positions."""
    sched = SlotScheduler(batch_size=4)
    a, b, c = Seq("a"), Seq("b", prompt_ids=[1, 2]), Seq("c", prompt_ids=list(range(20)))
    d = Seq("d", prompt_ids=list(range(30)))
    for seq in (a, b, c, d):
        sched.add(seq)
    prefilled(sched.schedule_prefills(limit=4), sched)
    sched.release(a)  # row 0: the window is rows 1..3 as they are
    plan = sched.schedule_decode()
    assert plan.moves == () and [r.row for r in plan.decodes] == [1, 2, 3]
    sched.release(c)  # row 2 is a hole between b (2 positions) and d (30): b moves up next to d
    plan = sched.schedule_decode()
    assert plan.moves == (RowCopy(src=1, dst=2, length=2),)
    assert plan.decodes == (DecodeRow("b", 2, 40, 2), DecodeRow("d", 3, 40, 30))
    assert sched.running == [b, d] and sched.schedule_decode().moves == ()


def chunks_until_done(sched: SlotScheduler, budget: int | None) -> list[list[tuple[str, int, int]]]:
    """Plan prefill steps until nothing waits or is being prefilled: each step's (request, start, stop) chunks."""
    steps = []
    while sched.waiting or sched.prefilling:
        plan = sched.schedule_prefills(token_budget=budget)
        steps.append([(g.request_id, g.start, g.stop) for g in plan.prefills])
        prefilled(StepPlan(prefills=tuple(g for g in plan.prefills if g.done)), sched)
    return steps


def test_prompts_are_cut_into_chunks_within_the_token_budget():
    """Each step's chunks share one call within the budget (chunks x the longest); every prompt's chunks follow on
    from position 0 to its end, oldest first; without a budget each prompt goes whole (up to ``max_chunk``)."""
    lengths = [10, 10, 30, 5, 5, 50]
    sched = SlotScheduler(batch_size=8)
    for i, n in enumerate(lengths):
        sched.add(Seq(f"r{i}", prompt_ids=list(range(n))))
    steps = chunks_until_done(sched, 40)
    covered: dict[str, int] = {}
    for step in steps:
        assert len(step) * max(stop - start for _, start, stop in step) <= 40
        for rid, start, stop in step:
            assert covered.get(rid, 0) == start < stop
            covered[rid] = stop
    assert covered == {f"r{i}": n for i, n in enumerate(lengths)}
    assert steps[0] == [("r0", 0, 10), ("r1", 0, 10), ("r2", 0, 10), ("r3", 0, 5)]
    whole = SlotScheduler(batch_size=8, max_chunk=32)
    for i, n in enumerate(lengths):
        whole.add(Seq(f"r{i}", prompt_ids=list(range(n))))
    assert chunks_until_done(whole, None) == [[("r0", 0, 10), ("r1", 0, 10), ("r2", 0, 30), ("r3", 0, 5),
                                               ("r4", 0, 5), ("r5", 0, 32)], [("r5", 32, 50)]]


def test_a_long_prompt_goes_in_chunks_between_decode_steps_that_never_stop():
    """While a stream decodes, a 50-token prompt takes what the step's budget leaves after the decode token, one
    chunk a step; the stream is in every decode step, and the prompt decodes only after its last chunk."""
    sched = SlotScheduler(batch_size=2, max_chunk=16)
    stream, long = Seq("stream", max_tokens=100), Seq("long", prompt_ids=list(range(50)))
    sched.add(stream)
    prefilled(sched.schedule_prefills(token_budget=sched.prefill_budget(8)), sched)
    sched.add(long)
    assert sched.prefill_budget(8) == 7  # 8 - the stream's decode token
    chunks = []
    while True:
        plan = sched.schedule_prefills(token_budget=sched.prefill_budget(8))
        chunks += [(g.start, g.stop) for g in plan.prefills]
        prefilled(StepPlan(prefills=tuple(g for g in plan.prefills if g.done)), sched)
        decodes = [d.request_id for d in sched.schedule_decode().decodes]
        stream.output.append(41)
        if decodes != ["stream"]:
            break
    assert chunks == [(i, min(i + 7, 50)) for i in range(0, 50, 7)] and decodes == ["stream", "long"]
    assert sched.prefill_budget(None) is None and SlotScheduler(2, max_chunk=16).prefill_budget(8) == 16


def test_a_fork_group_takes_its_rows_at_once_and_keeps_fifo():
    sched = SlotScheduler(batch_size=3)
    first, leader, fork, later, busy = (Seq(n) for n in ("first", "leader", "fork", "later", "busy"))
    leader.forks = [fork]
    for seq in (first, busy, leader, later):
        sched.add(seq)
    prefilled(sched.schedule_prefills(limit=2), sched)  # first and busy: one row left
    plan = sched.schedule_prefills(limit=5)  # the group of two must wait, and so does what follows it
    assert plan.prefills == () and list(sched.waiting) == [leader, later]
    sched.release(busy)
    plan = sched.schedule_prefills(limit=1)
    (group,) = plan.prefills
    assert (group.request_id, group.rows) == ("leader", (1, 2))
    assert group.fork_copies == (RowCopy(src=1, dst=2, length=3),)  # the prompt's KV, after the leader's prefill
    assert leader.forks == [] and sched.all_sequences() == [later, first, leader, fork]


def test_a_scoring_only_group_keeps_its_forks_and_prompt_logprobs_take_their_own_call():
    sched = SlotScheduler(batch_size=4)
    leader, fork = Seq("leader", max_tokens=0, prompt_logprobs=2), Seq("fork", max_tokens=0, prompt_logprobs=2)
    leader.forks = [fork]
    sched.add(leader)
    (group,) = sched.schedule_prefills(limit=1).prefills
    # the forks' rows are named (every member gets the leader's prompt logprobs); the runner copies no KV for them
    assert group.own_call and group.scoring_only and group.rows == (0, 1)


def test_aborts_and_timeouts_free_rows_wherever_the_sequence_is():
    sched = SlotScheduler(batch_size=2)
    running, waiting, done = Seq("run"), Seq("wait"), Seq("done")
    sched.add(running)
    prefilled(sched.schedule_prefills(limit=1), sched)
    sched.add(waiting)
    assert sched.remove("run") is running and sched.free_rows == 2  # abort: the row is free at once
    for seq in (waiting, done):  # a timeout discards: queued, and neither queued nor seated, both fine
        sched.discard(seq)
    assert sched.idle and sched.remove("run") is None
    assert sched.schedule_decode() == StepPlan()


def test_removing_a_waiting_leader_promotes_its_fork():
    sched = SlotScheduler(batch_size=4)
    leader, a, b = Seq("leader"), Seq("a"), Seq("b")
    leader.forks = [a, b]
    sched.add(leader)
    assert sched.remove("a") is a and leader.forks == [b]
    assert sched.remove("leader") is leader and list(sched.waiting) == [b] and b.forks == []


def test_speculation_lookahead_is_capped_by_each_rows_room():
    sched = SlotScheduler(batch_size=3, spec_length=4)
    roomy, short, last = Seq("roomy", max_tokens=20), Seq("short", max_tokens=3), Seq("last", max_tokens=1)
    for seq in (roomy, short, last):
        sched.add(seq)
    prefilled(sched.schedule_prefills(limit=3), sched)
    # room after the first token: 19, 2 and 0 tokens; the target adds one of its own to the drafts it verifies
    assert [d.num_draft for d in sched.schedule_decode().decodes] == [4, 1, 0]
    assert [d.num_draft for d in SlotScheduler(1).schedule_decode().decodes] == []


def test_decode_rows_follow_the_model_length():
    sched = SlotScheduler(batch_size=1, spec_length=4)
    seq = Seq("near-the-end", prompt_ids=list(range(10)), max_tokens=100, max_model_len=13)
    sched.add(seq)
    prefilled(sched.schedule_prefills(limit=1), sched)
    (row,) = sched.schedule_decode().decodes
    assert (row.position, row.num_draft) == (10, 1)  # 11 of 13 positions used: room for 2 tokens


def test_batch_size_must_be_positive():
    with pytest.raises(ValueError):
        SlotScheduler(0)


def test_row_allocator_hands_out_lowest_rows_and_packs_them():
    rows: RowAllocator[str] = RowAllocator(4)
    assert [rows.allocate(o) for o in "abcd"] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="every one of the 4"):
        rows.allocate("e")
    rows.release("a")
    rows.release("c")
    assert rows.free == 2 and rows.compact({"b": 3, "d": 0}.__getitem__) == []  # d has nothing cached yet
    assert rows.owners() == ["d", "b"] and rows.row("d") == 0 and rows.at(1) == "b"
    assert rows.allocate("e") == 2 and rows.release("zz") is None
    with pytest.raises(KeyError):
        rows.at(3)


def test_a_fork_group_prefilled_in_chunks_copies_from_the_rows_it_holds_at_the_end():
    """A leader with a fork, prefilled 4 tokens a step while a stream decodes: compaction may move rows meanwhile,
    the fork copy of the last chunk names the rows as they are then; aborting the leader mid prompt hands the rest
    of the work to the fork, prefilled from its own row's start."""
    sched = SlotScheduler(batch_size=4, max_chunk=16)
    stream = Seq("stream", max_tokens=100)
    sched.add(stream)
    prefilled(sched.schedule_prefills(), sched)
    leader, fork = Seq("leader", prompt_ids=list(range(10))), Seq("fork", prompt_ids=list(range(10)))
    leader.forks = [fork]
    sched.add(leader)
    plan = sched.schedule_prefills(token_budget=4)
    assert [(g.request_id, g.start, g.stop, g.fork_copies) for g in plan.prefills] == [("leader", 0, 4, ())]
    assert [d.request_id for d in sched.schedule_decode().decodes] == ["stream"]
    sched.remove("stream")  # rows move under the prompt being prefilled: nothing breaks
    stream2 = Seq("late")
    sched.add(stream2)
    plan = sched.schedule_prefills(token_budget=4)
    assert [g.request_id for g in plan.prefills] == ["late"]  # a new short prompt goes first
    prefilled(plan, sched)
    (group,) = sched.schedule_prefills(token_budget=4).prefills
    assert (group.request_id, group.start, group.stop) == ("leader", 4, 8)
    sched.remove("leader")
    assert [(p.seq.request_id, p.computed, p.forks) for p in sched.prefilling][:1] == [("fork", 0, ())]
    plan = sched.schedule_prefills(token_budget=16)
    (heir,) = [g for g in plan.prefills if g.request_id == "fork"]
    assert (heir.start, heir.stop, heir.row) == (0, 10, sched.rows.row(fork))
    whole = SlotScheduler(batch_size=3, max_chunk=4)
    a, b = Seq("a", prompt_ids=list(range(6))), Seq("b", prompt_ids=list(range(6)))
    a.forks = [b]
    whole.add(a)
    first, last = whole.schedule_prefills(token_budget=4), whole.schedule_prefills(token_budget=4)
    assert first.prefills[0].fork_copies == ()
    assert last.prefills[0].fork_copies == (RowCopy(whole.rows.row(a), whole.rows.row(b), 6),)


def test_a_short_prompt_is_not_queued_behind_a_long_ones_chunks():
    """A long prompt being prefilled 8 tokens a step; a short one arriving meanwhile is admitted in the next step and
    finishes first; the long one gets what the step leaves, and all of it once no short prompt waits."""
    sched = SlotScheduler(batch_size=3, max_chunk=16)
    long, short = Seq("long", prompt_ids=list(range(40))), Seq("short", prompt_ids=list(range(6)))
    sched.add(long)
    assert [(g.request_id, g.start, g.stop) for g in sched.schedule_prefills(token_budget=8).prefills] == [
        ("long", 0, 8)]
    sched.add(short)
    assert [(g.request_id, g.start, g.stop) for g in sched.schedule_prefills(token_budget=8).prefills] == [
        ("short", 0, 6)]  # 2 x 6 > 8: the long one waits a step
    prefilled(StepPlan(prefills=tuple(g for g in sched.schedule_prefills(token_budget=8).prefills if g.done)), sched)
    assert [p.seq.request_id for p in sched.prefilling] == ["long"] and sched.prefilling[0].computed == 16
