"""Soak test of `neuronpack serve`: many concurrent streaming clients with random disconnects, for minutes.

A real server process is started on loopback from an artifact. First every distinct request (completions and chat,
several prompts and lengths, greedy) is run once at concurrency 1: that is its reference output. Then ``--clients``
asyncio clients (the official openai client, streaming) send random requests from that set until ``--duration`` is
over; each disconnects after a random number of chunks with probability ``--disconnect``. Checked:

- zero lost completions (every stream not dropped by its client ends with a finish_reason) and zero garbled ones
  (each completed text and finish_reason equal the reference of the same request);
- every slot freed at the end (``neuronpack_num_requests_running`` and ``..._waiting`` back to 0);
- resident memory of the server flat after warm-up (RSS sampled every second; the median of the last fifth of the
  run against the median of the fifth after warm-up).

Writes docs/bench/soak.json and docs/bench/soak.png (RSS and completions over time). The test suite runs a short
version of the same code (tests/runtime/test_soak.py) on the tiny artifact.

    .venv/bin/python -m bench.soak --artifact DIR [--clients 64] [--duration 300] [--disconnect 0.25]
    .venv/bin/python -m bench.soak [--compiler export]    # no --artifact: SmolLM2-135M-Instruct, compiled first
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench._common import (
    NEURONPACK,
    ROOT,
    bench_parser,
    free_port,
    model_checkpoint,
    save_line_plot,
    save_results,
    start_serve_process,
)
from neuronpack.runtime.engine.metrics import metric_value

MODEL_NAME = "soak"
PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea:",
    "Once upon a time, in a small village by the mountains,",
    "Explain in one paragraph how a compiler works.",
    "Here is a recipe for pancakes:",
    "Describe the water cycle to a ten-year-old.",
]


@dataclass(frozen=True)
class Job:
    """One distinct request: completions or chat, a prompt, a length (greedy, so its output is fixed)."""

    kind: str  # "completion" or "chat"
    prompt: str
    max_tokens: int


@dataclass
class SoakResult:
    clients: int
    duration_s: float
    disconnect_probability: float
    requests: int = 0
    completed: int = 0
    disconnected: int = 0
    lost: int = 0
    garbled: int = 0
    rejected: int = 0
    failures: list[str] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)  # {"t", "rss_mb", "completed", "running", "waiting"}
    slots_freed: bool = False
    aborted_by_server: float = 0.0
    rss_warm_mb: float = 0.0
    rss_end_mb: float = 0.0
    server_exit_code: int | None = None  # after SIGTERM: 0 when it shut down gracefully
    server_log_tail: str = ""

    @property
    def rss_growth_mb(self) -> float:
        return self.rss_end_mb - self.rss_warm_mb


def make_jobs(prompts: list[str], lengths: tuple[int, ...]) -> list[Job]:
    return [Job(kind, p, n) for kind in ("completion", "chat") for p in prompts for n in lengths]


async def _request(client, job: Job, *, stream: bool):
    if job.kind == "chat":
        return await client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": job.prompt}], max_tokens=job.max_tokens,
            temperature=0, stream=stream)
    return await client.completions.create(model=MODEL_NAME, prompt=job.prompt, max_tokens=job.max_tokens,
                                           temperature=0, stream=stream)


def _text(kind: str, choice) -> str:
    return (choice.delta.content or "") if kind == "chat" else choice.text


async def references(url: str, jobs: list[Job]) -> dict[Job, tuple[str, str]]:
    """Each job's (text, finish_reason), one request at a time (concurrency 1, not streamed)."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
    out = {}
    for job in jobs:
        reply = await _request(client, job, stream=False)
        choice = reply.choices[0]
        out[job] = (choice.message.content if job.kind == "chat" else choice.text, choice.finish_reason)
    await client.close()
    return out


async def soak(url: str, pid: int, refs: dict[Job, tuple[str, str]], *, clients: int, duration: float,
               disconnect: float, seed: int = 0) -> SoakResult:
    """Run the clients against ``url`` (server process ``pid``) and check every completed stream."""
    import httpx
    import openai
    import psutil

    result = SoakResult(clients, duration, disconnect)
    rng = random.Random(seed)
    jobs = list(refs)
    deadline = time.monotonic() + duration
    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=clients + 8), timeout=600)
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, http_client=http)

    async def one_client(index: int) -> None:
        local = random.Random(rng.random())
        while time.monotonic() < deadline:
            job = local.choice(jobs)
            drop_after = local.randint(0, 12) if local.random() < disconnect else None
            result.requests += 1
            parts, reason, chunks = [], None, 0
            try:
                stream = await _request(client, job, stream=True)
                dropped = False
                async for chunk in stream:
                    if not chunk.choices:
                        continue
                    parts.append(_text(job.kind, chunk.choices[0]))
                    reason = chunk.choices[0].finish_reason or reason
                    chunks += 1
                    if drop_after is not None and chunks > drop_after and reason is None:
                        await stream.close()  # the client goes away mid-stream
                        dropped = True
                        break
                if dropped:
                    result.disconnected += 1
                    continue
            except openai.APIStatusError as exc:
                if exc.status_code == 503:
                    result.rejected += 1
                    await asyncio.sleep(1)
                    continue
                result.lost += 1
                result.failures.append(f"{job}: HTTP {exc.status_code} {exc.message}")
                continue
            except openai.APIError as exc:
                result.lost += 1
                cause = exc.__cause__ or exc.__context__
                result.failures.append(f"{job}: {type(exc).__name__}: {exc} ({type(cause).__name__}: {cause!r}) "
                                       f"after {chunks} chunks")
                continue
            text = "".join(parts)
            if reason is None:
                result.lost += 1
                result.failures.append(f"{job}: stream ended without a finish_reason")
            elif (text, reason) != refs[job]:
                result.garbled += 1
                result.failures.append(f"{job}: got {(text, reason)!r}, expected {refs[job]!r}")
            else:
                result.completed += 1

    async def sample() -> None:
        process = psutil.Process(pid)
        started = time.monotonic()
        while time.monotonic() < deadline + 1:
            text = (await http.get(f"{url}/metrics")).text
            result.samples.append({
                "t": round(time.monotonic() - started, 2),
                "rss_mb": round(process.memory_info().rss / 2**20, 1),
                "completed": result.completed,
                "running": metric_value(text, "neuronpack_num_requests_running"),
                "waiting": metric_value(text, "neuronpack_num_requests_waiting"),
            })
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample())
    await asyncio.gather(*(one_client(i) for i in range(clients)))
    await sampler
    result.slots_freed = await _wait_idle(http, url)
    text = (await http.get(f"{url}/metrics")).text
    result.aborted_by_server = metric_value(text, "neuronpack_requests_total", 'finish_reason="abort"')
    rss = [s["rss_mb"] for s in result.samples]
    fifth = max(1, len(rss) // 5)
    result.rss_warm_mb = statistics.median(rss[fifth: 2 * fifth]) if len(rss) >= 5 else rss[0]
    result.rss_end_mb = statistics.median(rss[-fifth:])
    await client.close()
    return result


async def _wait_idle(http, url: str, timeout: float = 60) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        text = (await http.get(f"{url}/metrics")).text
        if metric_value(text, "neuronpack_num_requests_running") == 0 and metric_value(
                text, "neuronpack_num_requests_waiting") == 0:
            return True
        await asyncio.sleep(0.2)
    return False


def run(artifact: Path, *, clients: int, duration: float, disconnect: float, threads: int,
        lengths: tuple[int, ...], prompts: list[str] = PROMPTS, seed: int = 0) -> SoakResult:
    """Start the server on ``artifact``, take the references, soak, stop the server (SIGTERM, exit 0)."""
    port = free_port()
    proc, _ = start_serve_process(artifact, port, ["--threads", str(threads), "--served-model-name", MODEL_NAME,
                                                   "--quiet"])
    url = f"http://127.0.0.1:{port}"
    try:
        refs = asyncio.run(references(url, make_jobs(prompts, lengths)))
        result = asyncio.run(soak(url, proc.pid, refs, clients=clients, duration=duration, disconnect=disconnect,
                                  seed=seed))
    finally:
        proc.terminate()
        code = proc.wait(timeout=120)
    result.server_exit_code = code
    result.server_log_tail = proc.log_path.read_text()[-4000:]
    proc.log_path.unlink()
    return result


def plot(result: SoakResult, title: str) -> Path:
    return save_line_plot("soak", [s["t"] for s in result.samples],
                          {"server RSS (MB)": [s["rss_mb"] for s in result.samples]}, xlabel="seconds",
                          ylabel="RSS (MB)", title=title, figsize=(8, 3.8),
                          right=("completions", [s["completed"] for s in result.samples]))


def compile_smollm2(model: Path, work: Path, compiler: str, batch_size: int) -> Path:
    out = subprocess.run([*NEURONPACK, "compile", str(model), "--recipe", str(ROOT / "recipes/smollm2-135m-cpu.toml"),
                          "--set", f"compiler={compiler}", "--set", f"target.batch_size={batch_size}",
                          "--out-root", str(work / "root"), "--quiet"], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("soak", __doc__, model="smollm2", threads=1)
    parser.add_argument("--artifact", type=Path, help="a compiled torch artifact (default: compile SmolLM2)")
    parser.add_argument("--compiler", default="export", help="with no --artifact: export (fast) or aoti")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--disconnect", type=float, default=0.25)
    parser.add_argument("--lengths", default="16,32,48", help="max_tokens values, comma-separated")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    artifact = args.artifact or compile_smollm2(model_checkpoint(args), args.workdir, args.compiler, args.batch_size)
    load_before = os.getloadavg()
    started = time.perf_counter()
    result = run(artifact, clients=args.clients, duration=args.duration, disconnect=args.disconnect,
                 threads=args.threads, lengths=tuple(int(x) for x in args.lengths.split(",")))
    wall = time.perf_counter() - started
    load_after = os.getloadavg()
    ok = result.lost == 0 and result.garbled == 0 and result.slots_freed and result.server_exit_code == 0
    payload = {"result": {**asdict(result), "rss_growth_mb": result.rss_growth_mb}, "ok": ok,
               "artifact": str(artifact), "wall_s": round(wall, 1), "threads": args.threads,
               "load_average": {"before": load_before, "after": load_after}}
    save_results("soak", payload)
    plot(result, f"soak: {args.clients} streaming clients, {result.disconnected} disconnects, "
                 f"{result.completed} verified completions")
    print(f"clients {result.clients}  duration {result.duration_s:.0f} s  requests {result.requests}  "
          f"completed+verified {result.completed}  disconnected {result.disconnected}  rejected(503) "
          f"{result.rejected}")
    print(f"lost {result.lost}  garbled {result.garbled}  slots freed {result.slots_freed}  server aborts "
          f"{result.aborted_by_server:.0f}  exit status after SIGTERM {result.server_exit_code}")
    print(f"RSS after warm-up {result.rss_warm_mb:.1f} MB, at the end {result.rss_end_mb:.1f} MB "
          f"(growth {result.rss_growth_mb:+.1f} MB); load average {load_before[0]:.1f} -> {load_after[0]:.1f} on "
          f"{os.cpu_count()} cores")
    for failure in result.failures[:10]:
        print("  failure:", failure)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
