"""RowMap: the active slots of a decode step are packed into the first cache rows with as few swaps as needed."""

from neuronpack.backends.torch_aot.rows import RowMap


def test_packed_slots_need_no_swap():
    rows = RowMap(4)
    assert rows.pack([0, 1]) == [] and rows.rows([0, 1]) == [0, 1]


def test_a_high_slot_swaps_into_an_idle_low_row_copying_only_written_positions():
    rows = RowMap(4)
    rows.wrote(3, 12)
    rows.wrote(0, 5)
    assert rows.pack([3]) == [(0, 3, 12)]  # the longer of the two written prefixes
    assert (rows.row(3), rows.row(0)) == (0, 3)  # slot 0's data now lives in row 3, intact
    assert rows.pack([3]) == []  # stable once packed
    assert sorted(rows.rows([3, 0])) == [0, 3]
    rows.pack([3, 0])  # both active: rows 0 and 1
    assert sorted(rows.rows([3, 0])) == [0, 1]


def test_permutation_stays_consistent_over_many_active_sets():
    rows = RowMap(5)
    for active in ([4, 2], [1, 3, 4], [0], [2, 3, 4, 1], [4]):
        rows.pack(active)
        assert sorted(rows.rows(active)) == list(range(len(active)))
        assert sorted(rows.rows(range(5))) == list(range(5))  # still a permutation


def test_unwritten_rows_swap_for_free():
    rows = RowMap(3)
    assert rows.pack([2]) == []  # nothing written: only the table changes
    assert rows.row(2) == 0
