"""Property-based fuzzing (hypothesis) of every parser that reads user input: the contract is that bad input raises
a NeuronpackError subclass with a one-line message, and never any other exception.

Runs are bounded: each test sets its own ``max_examples`` (scaled by ``NEURONPACK_FUZZ_SCALE``, default 1, e.g.
``NEURONPACK_FUZZ_SCALE=20 pytest tests/fuzz`` for a long local campaign) and no deadline (the machine is shared).
The examples are derandomized (the same on every run, so `make test` cannot flip between green and red);
``NEURONPACK_FUZZ_RANDOM=1`` draws new ones for a campaign.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

SCALE = float(os.environ.get("NEURONPACK_FUZZ_SCALE", "1"))
RANDOM = os.environ.get("NEURONPACK_FUZZ_RANDOM") == "1"


def fuzz_settings(max_examples: int) -> settings:
    """Settings for one fuzz test: ``max_examples`` (times NEURONPACK_FUZZ_SCALE), no deadline, no example database
    (a fresh clone behaves like CI), derandomized unless NEURONPACK_FUZZ_RANDOM=1, tmp_path reuse across examples
    allowed."""
    return settings(
        max_examples=max(1, int(max_examples * SCALE)),
        deadline=None,
        database=None,
        derandomize=not RANDOM,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def assert_one_line(exc: BaseException) -> None:
    """A user-facing error: one line, with a message and a fix."""
    from neuronpack.errors import NeuronpackError

    assert isinstance(exc, NeuronpackError), f"{type(exc).__name__}: {exc}"
    line = exc.one_line()
    assert line and "\n" not in line and "Traceback" not in line
    assert exc.fix, f"no fix in: {line}"
