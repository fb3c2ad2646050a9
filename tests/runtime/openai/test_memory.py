"""runtime/openai/memory.py: glibc arena cap, heap release, and the release each time the server goes idle."""

import asyncio
import platform
from concurrent.futures import ThreadPoolExecutor

import pytest

from neuronpack.runtime.openai.memory import limit_malloc_arenas, release_free_memory, release_memory_when_idle

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc settings")


@glibc
def test_glibc_settings_apply():
    assert limit_malloc_arenas(8) is True  # 8 arenas: harmless for the rest of the test session
    blocks = [bytearray(256 * 1024) for _ in range(64)]  # 16 MB of heap, freed again
    del blocks
    release_free_memory()  # True only when it gave memory back; it must not fail either way


def test_memory_is_released_once_per_burst_when_the_server_goes_idle():
    load = iter([0, 2, 1, 0, 0, 0, 3, 0, 0])  # in-flight requests at each check: two bursts
    releases = []

    async def run():
        with ThreadPoolExecutor(1) as pool:
            task = asyncio.create_task(release_memory_when_idle(lambda: next(load, 0), pool, period=0.001,
                                                                release=lambda: releases.append(1)))
            await asyncio.sleep(0.2)
            task.cancel()

    asyncio.run(run())
    assert len(releases) == 2  # idle at the start is no reason; once after each burst, not at every idle check
