"""TEST STAND-IN for vllm_neuron/utils/timer.py (missing from ../shared/upstream; compile/backend.py imports
``timer`` at module level): ``with timer() as t: ...; t()`` gives the seconds the block took."""

from __future__ import annotations

import contextlib
import time


@contextlib.contextmanager
def timer():
    start = time.perf_counter()
    end: list[float] = []
    yield lambda: (end[0] if end else time.perf_counter()) - start
    end.append(time.perf_counter())
