"""A chat application's load, for any OpenAI-compatible server: concurrent streamed chat requests that share one
long system prompt and differ in a short user message (bench/peers_serve.py ``--shared-prefix``,
bench/serve_memory.py ``--prefix-cache-memory``, bench/prefix_cache.py).

    system = system_prompt(model_dir, 400)           # about 400 tokens with a question, through the chat template
    asyncio.run(chat_round(port, 8, system, QUESTIONS, 64))  # {"tokens_per_s": ..., "ttft_p50_s": ..., ...}
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from bench.serve import timed_stream

SYSTEM = ("You are the support assistant of a company that builds compilers for machine learning models. Answer "
          "in plain words, in at most three sentences, and say so when you do not know. The product turns a model "
          "checkpoint and a recipe into a compiled artifact that a server loads without compiling again; the recipe "
          "names the target machine, the batch size, the sequence length and the buckets of prompt lengths. ")
QUESTIONS = ["What does a recipe name?", "Why compile before serving?", "What is a bucket?",
             "Can I change the batch size later?", "What is an artifact?", "Which machines are supported?",
             "How long does a compile take?", "Where do artifacts live?", "What is a sequence length?",
             "Does the server compile anything?", "Who writes the recipe?", "What happens on a cache hit?",
             "Can two servers share an artifact?", "What is a prompt length bucket?", "How do I start a server?",
             "What if my prompt is too long?"]


def chat_ids(tokenizer, system: str, question: str) -> list[int]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"])


def grow_system(prompt_tokens: Callable[[str], int], tokens: int) -> str:
    """SYSTEM repeated, then cut by words, until ``prompt_tokens(system)`` (the length of a chat prompt of it and
    the first question, by whichever tokenizer the caller runs) is about ``tokens``."""
    system = SYSTEM
    while prompt_tokens(system) < tokens:
        system += SYSTEM
    words = system.split(" ")
    while prompt_tokens(" ".join(words)) > tokens:
        words.pop()
    return " ".join(words)


def system_prompt(model_dir: Path, tokens: int) -> str:
    """``grow_system`` with the checkpoint's tokenizer and chat template."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    return grow_system(lambda system: len(chat_ids(tokenizer, system, QUESTIONS[0])), tokens)


async def _one(client, system: str, question: str, max_tokens: int, extra_body: dict) -> tuple[float, int, float]:
    """bench/serve.py's ``timed_stream`` of one streamed chat completion."""
    t0 = time.perf_counter()
    stream = await client.chat.completions.create(
        model="smollm2", messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=max_tokens, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, **extra_body})
    return await timed_stream(stream, t0, lambda choice: choice.delta.content)


async def chat_round(port: int, concurrency: int, system: str, questions: list[str], max_tokens: int,
                     extra_body: dict | None = None) -> dict:
    """Every question once with ``system``, ``concurrency`` requests at a time: aggregate generated tokens/s,
    TTFT p50 / p99."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
    gate = asyncio.Semaphore(concurrency)

    async def gated(question: str):
        async with gate:
            return await _one(client, system, question, max_tokens, extra_body or {})

    started = time.perf_counter()
    async with client:
        results = await asyncio.gather(*(gated(q) for q in questions))
    elapsed = max(r[2] for r in results) - started
    ttfts = sorted(r[0] for r in results)
    tokens = sum(r[1] for r in results)
    return {"concurrency": concurrency, "requests": len(questions), "tokens": tokens, "seconds": elapsed,
            "tokens_per_s": tokens / elapsed, "ttft_p50_s": statistics.median(ttfts),
            "ttft_p99_s": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]}
