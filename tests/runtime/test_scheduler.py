"""Slot bookkeeping of continuous batching (no model involved: the policy on its own)."""

import pytest

from neuronpack.runtime.requests import RequestState
from neuronpack.runtime.sampling import RowSampler, SamplingParams
from neuronpack.runtime.scheduler import SlotScheduler
from neuronpack.runtime.stopping import IncrementalDetokenizer, SequenceOutput, StopRules
from neuronpack.runtime.tokenizer import ArtifactTokenizer


@pytest.fixture(scope="module")
def make_seq(tokenizer_dir):
    tok = ArtifactTokenizer.from_dir(tokenizer_dir)

    def make(name: str, prompt=(5, 6, 7)) -> RequestState:
        rules = StopRules(eos_token_ids=frozenset({2}), max_tokens=8, max_model_len=128)
        output = SequenceOutput(rules, list(prompt), IncrementalDetokenizer(tok, list(prompt)))
        return RequestState(name, list(prompt), RowSampler(SamplingParams().resolve()), output, sink=lambda out: None)

    return make


def test_admit_is_fifo_into_the_lowest_free_slots(make_seq):
    sched = SlotScheduler(batch_size=3)
    seqs = [make_seq(f"r{i}") for i in range(5)]
    for seq in seqs:
        sched.add(seq)
    assert sched.admit(limit=2) == seqs[:2]
    assert [s.slot for s in seqs[:2]] == [0, 1]
    assert sched.admit(limit=5) == [seqs[2]]  # only one slot left
    assert sched.free_slots == 0 and list(sched.waiting) == seqs[3:]
    sched.release(seqs[1])
    assert seqs[1].slot is None and sched.free_slots == 1
    assert sched.admit(limit=5) == [seqs[3]] and seqs[3].slot == 1  # the freed slot is reused


def test_remove_waiting_or_running(make_seq):
    sched = SlotScheduler(batch_size=1)
    a, b = make_seq("a"), make_seq("b")
    sched.add(a)
    sched.add(b)
    sched.admit(limit=1)
    assert sched.remove("b") is b and not sched.waiting
    assert sched.remove("a") is a and sched.free_slots == 1 and sched.idle
    assert sched.remove("a") is None


def test_decode_inputs_list_the_running_sequences_with_their_slots(make_seq):
    sched = SlotScheduler(batch_size=4)
    a, b = make_seq("a", prompt=(1, 2, 3)), make_seq("b", prompt=(4, 5))
    for seq in (a, b):
        sched.add(seq)
    sched.admit(limit=2)
    a.output.append(40)  # a: 3 prompt tokens + 1 sampled -> its last token goes to position 3
    b.output.append(50)
    b.output.append(51)  # b: 2 + 2 -> position 3
    sched.release(a)
    assert sched.decode_inputs() == ([1], [51], [3])  # running sequences only: b in slot 1


def test_discard_drops_a_sequence_wherever_it_is(make_seq):
    sched = SlotScheduler(batch_size=1)
    running, waiting, done = make_seq("run"), make_seq("wait"), make_seq("done")
    sched.add(running)
    sched.admit(limit=1)
    sched.add(waiting)
    for seq in (running, waiting, done):  # seated, queued, and neither: all fine
        sched.discard(seq)
    assert sched.idle and running.slot is None


def test_batch_size_must_be_positive():
    with pytest.raises(ValueError):
        SlotScheduler(0)


def test_a_fork_group_takes_its_slots_at_once_and_keeps_fifo(make_seq):
    sched = SlotScheduler(batch_size=3)
    first, leader, fork, later = (make_seq(n) for n in ("first", "leader", "fork", "later"))
    leader.forks = [fork]
    for seq in (first, leader, later):
        sched.add(seq)
    sched.admit(limit=1)
    sched.slots[2] = make_seq("busy")  # one slot left: the group of two must wait, and so does what follows it
    assert sched.admit(limit=5) == [] and list(sched.waiting) == [leader, later]
    sched.slots[2] = None
    assert sched.admit(limit=1) == [leader] and (leader.slot, fork.slot) == (1, 2)
    assert sched.all_sequences() == [later, first, leader, fork]


def test_removing_a_waiting_leader_promotes_its_fork(make_seq):
    sched = SlotScheduler(batch_size=4)
    leader, a, b = make_seq("leader"), make_seq("a"), make_seq("b")
    leader.forks = [a, b]
    sched.add(leader)
    assert sched.remove("a") is a and leader.forks == [b]
    assert sched.remove("leader") is leader and list(sched.waiting) == [b] and b.forks == []
