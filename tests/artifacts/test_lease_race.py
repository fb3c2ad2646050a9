"""file:// compare-and-swap under real contention: processes racing to take over one dead push lease (or to swap
one version of an object) produce exactly one winner per round, the object holding the winner's bytes; a claim
left by a writer that died mid-swap is broken after CLAIM_STALE, so a key is never stuck."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from neuronpack.artifacts.remote import filesystem
from neuronpack.artifacts.remote.filesystem import FileTransport
from neuronpack.artifacts.remote.push import LEASE_NAME, LEASE_STALE, take_over_stale_lease

WORKERS = 6
ROUNDS = 150
LEASE = f"{'a' * 64}/{LEASE_NAME}"


def _contender(url: str, worker: int, barrier, results, swap_directly: bool) -> None:
    """Each round: wait for the stale lease to be laid out, race for it, report (round, worker, etag or None)."""
    transport = FileTransport(url)
    for round_ in range(ROUNDS):
        barrier.wait()  # the main process laid out a stale lease
        current = transport.stat(LEASE)
        barrier.wait()  # every worker has read the same version
        if swap_directly:
            etag = transport.write(LEASE, f"{round_}:{worker}".encode(), if_match=current.etag)
        else:
            etag = take_over_stale_lease(transport, LEASE)
        results.put((round_, worker, etag, transport.read(LEASE) if etag else None))
        barrier.wait()  # the main process checks the round


@pytest.mark.parametrize("swap_directly", [False, True], ids=["take_over_stale_lease", "write_if_match"])
def test_racing_processes_take_over_a_dead_lease_exactly_once_per_round(tmp_path, swap_directly):
    url = f"file://{tmp_path / 'store'}"
    transport = FileTransport(url)
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(WORKERS + 1), ctx.Queue()
    workers = [ctx.Process(target=_contender, args=(url, w, barrier, results, swap_directly), daemon=True)
               for w in range(WORKERS)]
    for process in workers:
        process.start()
    lease = tmp_path / "store" / LEASE
    try:
        for round_ in range(ROUNDS):
            transport.write(LEASE, b"dead pusher")
            old = time.time() - LEASE_STALE - 60
            os.utime(lease, (old, old))
            barrier.wait()
            barrier.wait()
            outcomes = [results.get(timeout=60) for _ in range(WORKERS)]
            barrier.wait()
            winners = [(worker, body) for r, worker, etag, body in outcomes if r == round_ and etag is not None]
            assert len(winners) == 1, (round_, winners)
            assert transport.stat(LEASE).etag == next(e for _, _, e, _ in outcomes if e is not None)
            if swap_directly:
                assert lease.read_bytes() == f"{round_}:{winners[0][0]}".encode()
        assert [p.name for p in lease.parent.iterdir() if p.name.startswith(".np-tmp-")] == []  # no claim left
    finally:
        barrier.abort()  # a failed round releases the workers instead of leaving them at the barrier
        for process in workers:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()


def test_a_claim_left_by_a_dead_writer_is_broken_after_claim_stale(tmp_path):
    transport = FileTransport(f"file://{tmp_path}")
    etag = transport.write("k/lease", b"v1")
    claim = tmp_path / "k" / f".np-tmp-cas-lease-{etag}"
    claim.write_bytes(b"a writer killed between its claim and its rename")
    assert transport.write("k/lease", b"v2", if_match=etag) is None  # a fresh claim: someone is swapping
    old = time.time() - filesystem.CLAIM_STALE - 1
    os.utime(claim, (old, old))
    new = transport.write("k/lease", b"v2", if_match=etag)
    assert new is not None and transport.read("k/lease") == b"v2"
    assert transport.write("k/lease", b"v3", if_match=etag) is None  # the old version is gone
    assert sorted(p.name for p in (tmp_path / "k").iterdir()) == ["lease"]


def test_a_stale_etag_never_wins_even_with_a_free_claim(tmp_path):
    transport = FileTransport(f"file://{tmp_path}")
    first = transport.write("k/lease", b"v1")
    second = transport.write("k/lease", b"v2", if_match=first)
    assert second is not None
    assert transport.write("k/lease", b"late", if_match=first) is None
    assert transport.read("k/lease") == b"v2"
