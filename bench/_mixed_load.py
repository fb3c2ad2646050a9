"""Chat streams while long prompts arrive, for any OpenAI-compatible server (bench/peers_serve.py ``--mixed``):
``chats`` clients each stream their chat requests one after the other (a short system prompt and a question,
``max_tokens`` each), while another client sends a ~``long_tokens``-token prompt every ``every_s`` seconds
(``longs`` of them, 8 tokens each; each begins differently, so no cache holds any of it). What a chat user sees
while someone else pastes a long document: the gaps between the tokens of their stream, and their time to first
token; and the long prompts' own time to first token.

    asyncio.run(mixed_round(port, system, long_text, chats=3, longs=3, every_s=4.0, max_tokens=48))
"""

from __future__ import annotations

import asyncio
import statistics
import time

import numpy as np

from bench._shared_prefix import QUESTIONS


async def _stream(client, messages: list[dict], max_tokens: int, extra_body: dict) -> tuple[float, list[float]]:
    """(start time, arrival time of every chunk that carried text) of one streamed greedy chat completion."""
    t0 = time.perf_counter()
    stream = await client.chat.completions.create(model="smollm2", messages=messages, max_tokens=max_tokens,
                                                  temperature=0, stream=True,
                                                  extra_body={"ignore_eos": True, **extra_body})
    ticks = []
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            ticks.append(time.perf_counter())
    return t0, ticks


async def mixed_round(port: int, system: str, long_text: str, *, chats: int, longs: int, every_s: float,
                      max_tokens: int, extra_body: dict | None = None) -> dict:
    """One round (see the module docstring): the chat streams' inter-token gaps (p50, p99, max) and TTFT p50, the
    long prompts' TTFT p50 and max, the chats' aggregate tokens/s."""
    import openai

    extra = extra_body or {}
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
    long_done = asyncio.Event()

    async def chat_client(k: int) -> list[tuple[float, list[float]]]:
        runs, i = [], 0
        while not long_done.is_set() or i < 2:
            question = QUESTIONS[(k * 5 + i) % len(QUESTIONS)]
            runs.append(await _stream(client, [{"role": "system", "content": system},
                                               {"role": "user", "content": question}], max_tokens, extra))
            i += 1
        return runs

    async def long_client() -> list[tuple[float, list[float]]]:
        runs = []
        await asyncio.sleep(every_s / 2)
        for n in range(longs):
            started = time.perf_counter()
            text = f"Document {n} of a batch sent at {started:.6f}. {long_text}\nSummarise the document."
            runs.append(await _stream(client, [{"role": "user", "content": text}], 8, extra))
            await asyncio.sleep(max(0.0, every_s - (time.perf_counter() - started)))
        long_done.set()
        return runs

    started = time.perf_counter()
    async with client:
        *chat_runs, long_runs = await asyncio.gather(*(chat_client(k) for k in range(chats)), long_client())
    elapsed = time.perf_counter() - started
    streams = [run for runs in chat_runs for run in runs]
    gaps = [b - a for _, ticks in streams for a, b in zip(ticks[:-1], ticks[1:], strict=True)]
    chat_ttft = [ticks[0] - t0 for t0, ticks in streams if ticks]
    long_ttft = [ticks[0] - t0 for t0, ticks in long_runs if ticks]
    return {"chat_requests": len(streams), "gap_p50_ms": float(np.percentile(gaps, 50)) * 1000,
            "gap_p99_ms": float(np.percentile(gaps, 99)) * 1000, "gap_max_ms": max(gaps) * 1000,
            "chat_ttft_p50_ms": statistics.median(chat_ttft) * 1000,
            "long_ttft_p50_ms": statistics.median(long_ttft) * 1000, "long_ttft_max_ms": max(long_ttft) * 1000,
            "chat_tokens_per_s": sum(len(ticks) for _, ticks in streams) / elapsed, "seconds": elapsed}
