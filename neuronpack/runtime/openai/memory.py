"""Keep a long-running server's resident memory near what it needs (weights + KV cache): glibc malloc settings.

glibc gives every thread that allocates its own malloc arena (up to 8 per core), and keeps freed memory of an arena
resident until it is trimmed. A server whose request threads come and go ends up holding freed memory in many
arenas (measured: bench/serve_memory.py). ``limit_malloc_arenas`` caps the arenas before the server's threads start;
``release_free_memory`` returns freed heap memory to the system: after loading the model (whose construction frees
its temporary tensors) and, through ``release_memory_when_idle``, each time the server goes idle (a burst of requests
leaves its activations, logits and request objects freed but resident). Both are no-ops on a C library other than
glibc.

Example::

    limit_malloc_arenas(2)      # True on glibc
    release_free_memory()
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
from collections.abc import Callable
from concurrent.futures import Executor

M_ARENA_MAX = -8  # glibc's mallopt parameter number (malloc.h)
SERVER_ARENAS = 2  # the engine thread and the event loop; more measured no faster, and cost ~35 MB after 32 streams
IDLE_CHECK_SECONDS = 1.0


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def limit_malloc_arenas(count: int = SERVER_ARENAS) -> bool:
    """Cap glibc's malloc arenas at ``count`` for threads created from now on; False where it cannot."""
    libc = _glibc()
    return bool(libc and libc.mallopt(M_ARENA_MAX, count))


def release_free_memory() -> bool:
    """Return freed heap memory to the system (glibc ``malloc_trim``); False where it cannot."""
    libc = _glibc()
    return bool(libc and libc.malloc_trim(0))


async def release_memory_when_idle(in_flight: Callable[[], int], executor: Executor, *,
                                   period: float = IDLE_CHECK_SECONDS,
                                   release: Callable[[], object] = release_free_memory) -> None:
    """Forever: every ``period`` seconds, when no request is in flight and some were since the last release, call
    ``release`` on ``executor`` (off the event loop). Cancel the task to stop it."""
    busy = False
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(period)
        if in_flight():
            busy = True
        elif busy:
            busy = False
            await loop.run_in_executor(executor, release)
