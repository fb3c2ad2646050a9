"""SIGKILL a `neuronpack` command at chosen progress markers (see marker_driver.py) and check what it left.

A sweep: one calibration run counts the markers M of the command and records its output; then, for kill points
chosen from 1..M (the first, the last, and a seeded random sample in between), run the command again and SIGKILL it
exactly at that marker, and call ``check`` on what is on disk; finally run it once more without a kill, which must
succeed and produce the calibration's output again.

Example::

    sweep = kill_sweep(["quantize", str(model), "--out", str(out), "--dtype", "int8"], root=tmp_path,
                       check=check_quantized, reset=lambda: shutil.rmtree(out, ignore_errors=True), kills=6)
    sweep.markers, sweep.killed      # (41, 6)
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DRIVER = Path(__file__).with_name("marker_driver.py")
# NEURONPACK_FAULT_KILLS=40 for a long local campaign; the suite's default keeps each sweep to a few runs.
DEFAULT_KILLS = int(os.environ.get("NEURONPACK_FAULT_KILLS", "5"))
SEED = int(os.environ.get("NEURONPACK_FAULT_SEED", "15"))


@dataclass
class Run:
    markers: list[str]
    returncode: int
    killed_at: int | None
    stderr: str


@dataclass
class Sweep:
    markers: int  # markers of the calibration run
    kill_points: list[int]
    killed: int  # runs that were really killed (a point past the end of a shorter run completes instead)
    labels: list[str] = field(default_factory=list)  # what each kill interrupted


def run_marked(args: list[str], *, root: Path, kill_at: int | None = None, env: dict | None = None,
               timeout: float = 600) -> Run:
    """Run `neuronpack ARGS` under the marker driver; SIGKILL it when it reaches marker ``kill_at`` (1-based)."""
    to_parent, from_child = os.pipe()  # child writes markers
    to_child_r, to_child_w = os.pipe()  # parent acknowledges
    err_path = Path(root) / f".driver-stderr-{time.monotonic_ns()}"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(DRIVER), str(from_child), str(to_child_r), str(root), "--", *args],
            pass_fds=(from_child, to_child_r), stdout=subprocess.DEVNULL, stderr=err,
            env={**os.environ, "NEURONPACK_DEBUG": "0", **(env or {})},
        )
    os.close(from_child)
    os.close(to_child_r)
    markers: list[str] = []
    buffer = b""
    killed_at = None
    deadline = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([to_parent], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError(f"neuronpack {' '.join(args)} made no progress for {timeout}s")
            chunk = os.read(to_parent, 65536)
            if not chunk:
                break
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                markers.append(line.decode(errors="replace"))
                if kill_at is not None and len(markers) == kill_at:
                    proc.send_signal(signal.SIGKILL)
                    killed_at = kill_at
                    break
                os.write(to_child_w, b"g")
            if killed_at is not None:
                break
    finally:
        os.close(to_parent)
        os.close(to_child_w)
        returncode = proc.wait(timeout=60)
    stderr = err_path.read_text()
    err_path.unlink()
    return Run(markers, returncode, killed_at, stderr)


def kill_sweep(args: list[str], *, root: Path, check: Callable[[], None], reset: Callable[[], None],
               kills: int = DEFAULT_KILLS, seed: int = SEED, env: dict | None = None,
               before_each: Callable[[], None] | None = None) -> Sweep:
    """Calibrate, kill at ``kills`` markers (checking after each), then run to completion. ``before_each`` sets up
    the input state of a run (e.g. a store to gc); ``reset`` removes a complete output so later points are reached;
    ``check`` asserts the invariants (nothing half-written visible) on the state a run left."""
    (before_each or (lambda: None))()
    calibration = run_marked(args, root=root, env=env)
    assert calibration.returncode == 0, calibration.stderr
    check()
    total = len(calibration.markers)
    assert total > 0, "the command reported no markers"
    rng = random.Random(seed)
    inner = range(2, total)
    points = sorted({1, total, *rng.sample(inner, min(max(0, kills - 2), len(inner)))})
    reset()
    sweep = Sweep(markers=total, kill_points=points, killed=0)
    for point in points:
        (before_each or (lambda: None))()
        run = run_marked(args, root=root, kill_at=point, env=env)
        if run.killed_at is not None:
            assert run.returncode == -signal.SIGKILL, run.stderr
            sweep.killed += 1
            sweep.labels.append(run.markers[-1])
        else:
            assert run.returncode == 0, run.stderr
        check()
        reset()
    (before_each or (lambda: None))()
    final = run_marked(args, root=root, env=env)
    assert final.returncode == 0, final.stderr
    check()
    return sweep
