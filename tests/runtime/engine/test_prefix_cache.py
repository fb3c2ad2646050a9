"""Prefix caching without a model and without torch: the block-hash index (prefix_cache.py) and what
``RowAllocator`` does with it (kv_rows.py): reuse, the copies it asks for, saving a free row's prefix before it is
overwritten, least-recently-used eviction within the cache rows, the LoRA salt, and the scheduler's plans."""

from __future__ import annotations

import pytest

from neuronpack.runtime.engine.kv_rows import RowAllocator, RowCopy
from neuronpack.runtime.engine.prefix_cache import MAX_CACHE_ROWS, PrefixCaching, PrefixIndex, block_hashes
from neuronpack.runtime.engine.scheduler import SlotScheduler
from tests.helpers.fresh_interpreter import run_fresh
from tests.runtime.engine.test_scheduler import Seq, prefilled


def test_block_hashes_are_chained_and_salted():
    a = block_hashes(list(range(10)), 0, 4)
    assert len(a) == 2  # two full blocks; the last two tokens are no block
    assert block_hashes(list(range(8)), 0, 4) == a  # block i names the whole prefix up to it
    assert block_hashes([0, 1, 2, 3, 9, 5, 6, 7], 0, 4)[0] == a[0] != block_hashes([0, 1, 2, 3, 9, 5, 6, 7], 0, 4)[1]
    assert block_hashes([9, 1, 2, 3, 4, 5, 6, 7], 0, 4)[1] != a[1]  # a change in block 0 changes block 1's hash
    assert block_hashes(list(range(8)), 1, 4) != a  # another adapter: other hashes


def test_the_index_finds_the_longest_prefix_token_by_token():
    index = PrefixIndex(block_size=4)
    index.add(5, list(range(10)), salt=0)
    index.add(6, [*range(6), 42, 43], salt=0)
    assert index.longest_match([*range(7), 99], salt=0) == (5, 7)  # two blocks by hash, then 3 tokens by comparison
    assert index.longest_match([*range(6), 42, 43, 44], salt=0) == (6, 8)
    assert index.longest_match([0, 1, 2, 9], salt=0) is None  # no full block in common
    assert index.longest_match(list(range(10)), salt=1) is None  # another adapter's KV
    assert index.add(7, [1, 2], salt=0) is None and 7 not in index  # shorter than a block: not kept
    index.forget(5)
    assert index.longest_match(list(range(10)), salt=0) == (6, 6)


def test_a_released_row_is_reused_in_place_or_copied():
    rows: RowAllocator[str] = RowAllocator(2, cache_rows=0, block_size=4)
    rows.allocate("a")
    rows.release("a", tokens=list(range(12)), salt=0)
    assert rows.lookup(list(range(12)), 0) == 11  # at least one position is left to prefill (its logits)
    assert rows.allocate_cached("b", [*range(9), 50], 0) == (0, 9) and rows.take_copies() == []  # its own row
    rows.allocate("c")
    rows.release("b", tokens=[*range(9), 50, 51], salt=0)  # row 0 free again, holding b's tokens
    rows.release("c")  # nothing kept
    assert rows.cached_rows() == {0: 11}
    rows.allocate("x")  # row 0: its prefix is dropped (no cache rows to save it in)
    assert rows.cached_rows() == {} and rows.take_copies() == []


def test_a_row_holding_as_long_a_match_is_reused_in_place():
    """Every free row holds the same system prompt (0..7) and its own question: a new question takes the lowest free
    row in place when it holds as much of the prompt as any other row, else the longest match is copied in."""
    rows: RowAllocator[str] = RowAllocator(3, block_size=4)
    for owner in "abc":
        rows.allocate(owner)
    rows.release("b", tokens=[*range(8), 30, 31, 32, 33, 34, 35], salt=0)
    rows.release("a", tokens=[*range(8), 20, 21, 22], salt=0)
    rows.release("c", tokens=[*range(8), 40, 41], salt=0)  # used last: the first of equal matches
    assert rows.allocate_cached("d", [*range(8), 50, 9], salt=0) == (0, 8)  # 8 in every row: row 0 in place
    assert rows.take_copies() == []
    assert rows.allocate_cached("e", [*range(8), 40, 9], salt=0) == (1, 9)  # row 2 holds one token more: copied
    assert rows.take_copies() == [RowCopy(2, 1, 9)]


def test_a_prefix_in_a_higher_row_is_copied_into_the_lowest_free_row():
    rows: RowAllocator[str] = RowAllocator(3, block_size=4)
    for owner in "abc":
        rows.allocate(owner)
    rows.release("c", tokens=list(range(8)), salt=3)
    rows.release("a")
    assert rows.allocate_cached("d", [*range(8), 1], salt=3) == (0, 8)
    assert rows.take_copies() == [RowCopy(2, 0, 8)]
    assert rows.allocate_cached("e", [*range(8), 1], salt=3) == (2, 8) and rows.take_copies() == []


def test_a_free_rows_prefix_is_saved_into_a_cache_row_before_it_is_overwritten():
    rows: RowAllocator[str] = RowAllocator(1, cache_rows=2, block_size=4)
    assert rows.total_rows == 3
    for i, owner in enumerate("abcd"):
        rows.allocate(owner)
        if i:
            copies = rows.take_copies()
            assert copies == [RowCopy(0, i if i < 3 else 1, 4 + i - 1)]  # the previous prefix goes to a cache row
        rows.release(owner, tokens=[i] * (4 + i), salt=0)
    # a (4 tokens) went to row 1, b to row 2, then c evicted a, the least recently used: rows hold b, c, d.
    assert rows.cached_rows() == {0: 7, 1: 6, 2: 5}
    assert rows.lookup([0] * 5, 0) == 0 and rows.lookup([1] * 6, 0) == 5
    rows.allocate_cached("e", [1] * 6, 0)  # reads b from row 2 (and makes it the most recently used)
    assert rows.take_copies() == [RowCopy(0, 1, 7), RowCopy(2, 0, 5)]  # d evicts c, then b comes into row 0


def test_saving_keeps_one_copy_of_a_prefix():
    rows: RowAllocator[str] = RowAllocator(1, cache_rows=2, block_size=4)
    rows.allocate("a")
    rows.release("a", tokens=list(range(6)), salt=0)
    rows.allocate("b")
    assert rows.take_copies() == [RowCopy(0, 1, 6)]
    rows.release("b", tokens=list(range(9)), salt=0)  # extends a's tokens: replaces it when saved
    rows.allocate("c")
    assert rows.take_copies() == [RowCopy(0, 1, 9)]
    rows.release("c", tokens=list(range(5)), salt=0)  # covered by the saved 9 tokens: dropped, not copied
    rows.allocate("d")
    assert rows.take_copies() == [] and rows.cached_rows() == {1: 9}


def test_the_source_of_a_reuse_is_never_evicted_by_the_same_allocation():
    rows: RowAllocator[str] = RowAllocator(1, cache_rows=1, block_size=4)
    rows.allocate("a")
    rows.release("a", tokens=[7] * 8, salt=0)
    rows.allocate("b")  # a's prefix into row 1
    rows.release("b", tokens=[8] * 8, salt=0)
    rows.take_copies()
    assert rows.allocate_cached("c", [7] * 8 + [1], 0) == (0, 8)
    assert rows.take_copies() == [RowCopy(1, 0, 8)]  # b's prefix is dropped rather than overwrite the source


def test_compaction_saves_the_hole_it_fills():
    rows: RowAllocator[str] = RowAllocator(3, cache_rows=1, block_size=4)
    for owner in "abc":
        rows.allocate(owner)
    rows.release("a", tokens=list(range(8)), salt=0)
    assert rows.compact({"b": 3, "c": 5}.__getitem__) == [RowCopy(0, 3, 8), RowCopy(2, 0, 5)]
    assert rows.cached_rows() == {3: 8} and rows.owners() == ["c", "b"]


def test_the_budget_is_rows_of_the_cache():
    assert PrefixCaching(memory_mib=1).cache_rows(row_bytes=2**18) == 4
    assert PrefixCaching(memory_mib=1).cache_rows(row_bytes=2**21) == 0
    assert PrefixCaching(memory_mib=10**6).cache_rows(row_bytes=1) == MAX_CACHE_ROWS
    assert PrefixCaching(enabled=False).cache_rows(row_bytes=1) == 0
    with pytest.raises(ValueError):
        RowAllocator(1, cache_rows=-1)


class CachedSeq(Seq):
    """A Seq that says which tokens its row holds (what RequestState.cached_tokens answers)."""

    @property
    def cached_tokens(self) -> list[int]:
        return [*self.prompt_ids, *self.output[:-1]]


def test_the_scheduler_plans_prefills_from_the_cached_position():
    sched = SlotScheduler(batch_size=3, cache_rows=1, block_size=4)
    first = CachedSeq("a", prompt_ids=list(range(10)))
    sched.add(first)
    plan = sched.schedule_prefills(limit=2)
    assert plan.prefills[0].start == 0 and plan.prefills[0].cache_query
    prefilled(plan, sched)
    first.output.append(41)
    sched.release(first)  # keeps prompt + 40: 11 tokens
    second = CachedSeq("b", prompt_ids=[*range(10), 40, 7])
    echo = CachedSeq("c", prompt_ids=list(range(10)), prompt_logprobs=1)
    fork = CachedSeq("b2", prompt_ids=second.prompt_ids)
    second.forks = [fork]
    sched.add(echo)
    sched.add(second)
    plan = sched.schedule_prefills(limit=2)
    echo_group, group = plan.prefills
    assert (echo_group.start, echo_group.cache_query) == (0, False)  # prompt logprobs: prefilled whole
    assert echo_group.row == 0 and plan.moves[0] == RowCopy(0, 3, 11)  # a's prefix saved before row 0 is taken
    assert (group.start, group.row) == (11, 1) and plan.moves[1:] == (RowCopy(3, 1, 11),)
    assert group.fork_copies[0].length == 12  # the fork gets the whole prompt after the prefill
    sched.discard(second, keep=False)  # a failed sequence keeps nothing
    assert 1 not in sched.rows.cached_rows()


def test_prefix_caching_imports_no_torch():
    _, torch_imported = run_fresh("import neuronpack.runtime.engine.kv_rows, neuronpack.runtime.engine.prefix_cache")
    assert not torch_imported
