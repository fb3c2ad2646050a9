"""How many requests the engine holds at once: at most ``batch_size + max_waiting`` in flight (the next one gets
ServerBusyError, HTTP 503), and none once draining (graceful shutdown). Thread-safe: requests are admitted on the
callers' threads and retired on the engine loop.

Example::

    admission = Admission(batch_size=4, max_waiting=8, metrics=metrics)
    admission.admit(2)      # two forks of one prompt
    admission.retire()      # one of them finished
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from neuronpack.errors import ServerBusyError

if TYPE_CHECKING:
    from neuronpack.runtime.engine.metrics import EngineMetrics


class Admission:
    """The in-flight count (submitted and not finished: waiting, in the inbox or holding a slot)."""

    def __init__(self, batch_size: int, max_waiting: int | None, metrics: EngineMetrics) -> None:
        self.batch_size, self.max_waiting, self.metrics = batch_size, max_waiting, metrics
        self._lock = threading.Lock()
        self.in_flight = 0
        self.draining = False

    def admit(self, n: int) -> None:
        """Count ``n`` new requests in, or raise ServerBusyError (full, or draining)."""
        with self._lock:
            if self.draining:
                self.metrics.rejected.labels(reason="shutting_down").inc()
                raise ServerBusyError("the server is shutting down and takes no new requests",
                                      fix="retry against another replica")
            if self.max_waiting is not None and self.in_flight + n > self.batch_size + self.max_waiting:
                self.metrics.rejected.labels(reason="queue_full").inc()
                raise ServerBusyError(
                    f"the server is at capacity ({self.batch_size} running, {self.max_waiting} waiting)",
                    fix="retry later",
                )
            self.in_flight += n

    def retire(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def drain(self) -> None:
        """Refuse new requests from now on."""
        with self._lock:
            self.draining = True
