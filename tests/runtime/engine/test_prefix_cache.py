"""Prefix caching without a model and without torch: the block-hash index (prefix_cache.py) and what
``RowAllocator`` does with it (kv_rows.py): reuse, the copies it asks for, saving a free row's prefix before it is
overwritten, least-recently-used eviction within the cache rows, the LoRA salt, and the scheduler's plans."""

from __future__ import annotations

import pytest

from neuronpack.runtime.engine.kv_rows import BlockCopy, BlockExchange, RowAllocator, RowCopy, RowSwap
from neuronpack.runtime.engine.prefix_cache import PrefixCaching, PrefixIndex, block_hashes
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


def test_a_released_row_is_reused_in_place():
    rows: RowAllocator[str] = RowAllocator(2, block_size=4)
    rows.allocate("a")
    rows.release("a", tokens=list(range(12)), salt=0)
    assert rows.lookup(list(range(12)), 0) == 11  # at least one position is left to prefill (its logits)
    assert rows.allocate_cached("b", [*range(9), 50], 0) == (0, 9) and rows.take_copies() == []  # its own row
    rows.allocate("c")
    rows.release("b", tokens=[*range(9), 50, 51], salt=0)  # row 0 free again, holding b's tokens
    rows.release("c")  # nothing kept
    assert rows.cached_rows() == {0: 11}
    assert rows.allocate("x") == 1  # an empty row before the one keeping a prefix
    assert rows.allocate("y") == 0 and rows.cached_rows() == {} and rows.take_copies() == []  # no pool: dropped


def test_a_new_prompt_takes_the_free_row_holding_its_prefix_else_the_least_recently_used():
    """Free rows keep their prefixes while others are free: a prompt takes the row holding its longest prefix
    in place (no copy); one that matches nothing takes the row used longest ago."""
    rows: RowAllocator[str] = RowAllocator(3, block_size=4)
    for owner in "abc":
        rows.allocate(owner)
    rows.release("b", tokens=[*range(8), 30, 31, 32, 33, 34, 35], salt=0)
    rows.release("a", tokens=[*range(8), 20, 21, 22], salt=0)
    rows.release("c", tokens=[40] * 9, salt=0)
    assert rows.allocate_cached("d", [*range(8), 30, 9], salt=0) == (1, 9)  # b's row: 9 tokens in place
    assert rows.take_copies() == []
    assert rows.allocate_cached("e", [7] * 9, salt=0) == (0, 0)  # no match: row 0 (a) was released longest ago
    assert rows.cached_rows() == {2: 9}


def test_one_prompt_at_a_time_keeps_every_prefix_the_free_rows_hold():
    """The issue's case: with no pool, distinct prompts sent one at a time each take an empty row, so the first is
    still there when it comes again (it used to be overwritten by the second)."""
    rows: RowAllocator[str] = RowAllocator(4, block_size=4)
    prompts = [[p] * 20 for p in range(4)]
    for i, prompt in enumerate(prompts):
        row, _ = rows.allocate_cached(f"r{i}", prompt, 0)
        assert row == i
        rows.release(f"r{i}", tokens=prompt, salt=0)
    assert rows.allocate_cached("again", prompts[0], 0) == (0, 19)


def test_a_free_rows_prefix_is_saved_into_the_pool_in_blocks_before_it_is_overwritten():
    rows: RowAllocator[str] = RowAllocator(1, cache_blocks=4, block_size=4)
    rows.allocate("a")
    rows.release("a", tokens=list(range(10)), salt=0)
    rows.allocate("b")  # the row's two full blocks go to the pool; the last 2 tokens are no block
    assert rows.take_copies() == [BlockCopy(0, (0, 1), (0, 1), True)] and rows.cache_blocks_in_use == 2
    rows.release("b", tokens=[*range(4), 9, 9, 9, 9, 9], salt=0)  # shares block 0 with a's prefix
    rows.allocate("c")
    assert rows.take_copies() == [BlockCopy(0, (1,), (2,), True)] and rows.cache_blocks_in_use == 3
    rows.release("c")
    assert rows.lookup([*range(9), 1], 0) == 8  # two blocks from the pool
    assert rows.allocate_cached("d", [*range(9), 1], 0) == (0, 8)
    assert rows.take_copies() == [BlockCopy(0, (0, 1), (0, 1), False)]


def test_the_pool_evicts_least_recently_used_leaves_and_a_hit_leaves_room_for_the_row_it_takes():
    rows: RowAllocator[str] = RowAllocator(1, cache_blocks=2, block_size=4)
    for i, owner in enumerate("abc"):
        rows.allocate(owner)
        rows.release(owner, tokens=[i] * 8, salt=0)
    rows.allocate("x")  # each prefix saved evicted the one before it: the pool holds c's two blocks
    rows.take_copies()
    assert rows.cache_blocks_in_use == 2 and rows.lookup([2] * 9, 0) == 8 and rows.lookup([0] * 9, 0) == 0
    rows.release("x", tokens=[5] * 8, salt=0)
    # d reads c's blocks into its row, whose own prefix (x's) goes into those very blocks: one exchange
    assert rows.allocate_cached("d", [2] * 9, 0) == (0, 8)
    assert rows.take_copies() == [BlockExchange(BlockCopy(0, (0, 1), (1, 0), True),
                                                BlockCopy(0, (0, 1), (0, 1), False))]
    assert rows.lookup([5] * 9, 0) == 8
    rows.release("d", tokens=[2] * 8, salt=0)
    assert rows.lookup([2] * 9, 0) == 8  # in the row


def test_a_replay_of_more_prefixes_than_rows_keeps_all_that_rows_and_pool_hold():
    """Issue 49's replay: 6 distinct prefixes, 4 rows and a pool of 2.5 prefixes' blocks; every repeat (the prefix
    plus a question of its own) hits every full block, whether its prefix is in a row or in the pool. Before, a
    repeat's row saved its copy of the shared prefix to the pool, and a hit from the pool kept its now-duplicate
    blocks: each evicted another prefix."""
    rows: RowAllocator[int] = RowAllocator(4, cache_blocks=95, block_size=16)
    stems = [[1000 * p + t for t in range(600)] for p in range(6)]
    served = iter(range(10**6))

    def send(prompt: list[int]) -> int:
        owner = next(served)
        _, hit = rows.allocate_cached(owner, prompt, 0)
        rows.take_copies()
        rows.release(owner, tokens=[*prompt, *range(7)], salt=0)  # the prompt and the first 7 generated tokens
        return hit

    assert [send([*stem, 1, 2]) for stem in stems] == [0] * 6
    for i, k in enumerate([2, 3, 5, 4, 3, 0, 1, 4, 0, 3, 2, 5] * 2):
        assert send([*stems[k], 50 + i, 6, 7]) >= 592  # 37 full blocks, or the whole prefix in a row
    assert rows.cache_blocks_in_use <= 95


def test_a_row_match_is_topped_up_from_the_pool():
    rows: RowAllocator[str] = RowAllocator(2, cache_blocks=8, block_size=4)
    rows.allocate("a")
    rows.release("a", tokens=list(range(16)), salt=0)
    rows.allocate("keep")
    rows.allocate("b")  # row 0's 16 tokens go to the pool
    rows.release("keep", tokens=list(range(6)), salt=0)  # row 1: the first 6 of them
    assert rows.take_copies() == [BlockCopy(0, (0, 1, 2, 3), (0, 1, 2, 3), True)]
    assert rows.allocate_cached("c", [*range(16), 3], 0) == (1, 16)  # row 1 in place, blocks 1..3 from the pool
    assert rows.take_copies() == [BlockCopy(1, (1, 2, 3), (1, 2, 3), False)]


def test_compaction_swaps_a_prefix_out_of_the_window_instead_of_dropping_it():
    rows: RowAllocator[str] = RowAllocator(3, block_size=4)
    for owner in "abc":
        rows.allocate(owner)
    rows.release("b", tokens=list(range(8)), salt=0)
    moves = rows.compact({"a": 30, "c": 5}.__getitem__)  # c (5 positions) moves next to a; the prefix goes to 2
    assert moves == [RowSwap(1, 2, 8, 5)]
    assert rows.cached_rows() == {2: 8} and rows.owners() == ["a", "c"]


def test_the_budget_is_blocks_of_kv():
    assert PrefixCaching(memory_mib=1).cache_blocks(token_bytes=2**10) == 64  # 16 KiB blocks
    assert PrefixCaching(memory_mib=1, block_size=32).cache_blocks(token_bytes=2**10) == 32
    assert PrefixCaching(memory_mib=0.01).cache_blocks(token_bytes=2**10) == 0
    assert PrefixCaching(enabled=False).cache_blocks(token_bytes=1) == 0
    with pytest.raises(ValueError):
        RowAllocator(1, cache_blocks=-1)


class CachedSeq(Seq):
    """A Seq that says which tokens its row holds (what RequestState.cached_tokens answers)."""

    @property
    def cached_tokens(self) -> list[int]:
        return [*self.prompt_ids, *self.output[:-1]]


def test_the_scheduler_plans_prefills_from_the_cached_position():
    sched = SlotScheduler(batch_size=3, cache_blocks=4, block_size=4)
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
    assert echo_group.row == 1 and plan.moves == ()  # an empty row: a's prefix stays in row 0
    assert (group.start, group.row) == (11, 0) and second.num_cached_tokens == 11  # a's row, in place
    assert group.fork_copies == (RowCopy(0, 2, 12),)  # the fork gets the whole prompt after the prefill
    sched.discard(second, keep=False)  # a failed sequence keeps nothing
    assert 0 not in sched.rows.cached_rows()


def test_prefix_caching_imports_no_torch():
    _, torch_imported = run_fresh("import neuronpack.runtime.engine.kv_rows, neuronpack.runtime.engine.prefix_cache")
    assert not torch_imported
