"""Helpers shared by the runtime and serve CLI tests: one real compiled artifact, a live uvicorn server on a free
loopback port, and transformers' greedy generate as the reference."""

from __future__ import annotations

import socket
import threading
import time
from functools import lru_cache
from pathlib import Path

from neuronpack.runtime.engine.metrics import metric_value  # noqa: F401 (the tests' import path)

RECIPE = Path(__file__).parents[2] / "recipes" / "tiny-test.toml"
# The tiny serving recipe: batch 4, seq_len 128, context buckets [16, 64], token generation [64, 128].
SERVE_OVERRIDES = [
    "target.batch_size=4",
    "target.seq_len=128",
    "target.max_context_length=64",
    "buckets.context=[16, 64]",
    "buckets.token_generation=[64, 128]",
]
EXPORT = ["compiler=export"]


def build_artifact(model_dir: Path, out_root: Path, overrides: list[str] = EXPORT) -> Path:
    """Compile (or reuse: the pipeline is content-addressed) the tiny serving artifact under ``out_root``."""
    from neuronpack.pipeline import compile_model

    return compile_model(str(model_dir), recipe=RECIPE, overrides=[*SERVE_OVERRIDES, *overrides],
                         out_root=out_root).path


def run_all(engine, requests) -> dict[str, list[int]]:
    """Submit every request at once (more than the 4 slots: some wait) and step until all finish."""
    outputs: dict[str, list[int]] = {r.request_id: [] for r in requests}
    for r in requests:
        engine.submit(r, lambda out, rid=r.request_id: outputs[rid].extend(out.token_ids))
    while engine.step():
        pass
    return outputs


@lru_cache(maxsize=4)
def _hf_model(model_dir: str):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()


def hf_greedy(model_dir: Path, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy continuation (stops after EOS like the engine does)."""
    import torch

    model = _hf_model(str(model_dir))
    with torch.no_grad():
        mask = torch.ones(1, len(prompt_ids), dtype=torch.long)
        out = model.generate(torch.tensor([prompt_ids]), attention_mask=mask, max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def wait_for_health(proc, port: int, timeout: float = 120.0) -> None:
    """Wait until a `neuronpack serve` child process answers /health on 127.0.0.1:port (fail if it exits)."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.stderr.read()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "server did not come up"
        time.sleep(0.2)


def hf_logits(model_dir: Path, token_ids: list[int]):
    """transformers' float32 logits at every position of ``token_ids``: [len, vocab]."""
    import torch

    with torch.no_grad():
        return _hf_model(str(model_dir))(torch.tensor([token_ids])).logits[0].float()


class LiveServer:
    """uvicorn serving ``app`` on a thread, bound to a free 127.0.0.1 port (race-free: we hand it the socket)."""

    def __init__(self, app) -> None:
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def engine_server(engine, **app_options) -> LiveServer:
    """A LiveServer of ``create_app(engine, **app_options)`` with ``.engine`` set, so tests can drive and inspect
    the engine behind it. Use it as a context manager, like LiveServer."""
    from neuronpack.runtime.openai.server import create_app

    live = LiveServer(create_app(engine, **app_options))
    live.engine = engine
    return live


def lora_server(artifact: Path, served_model_name: str) -> LiveServer:
    """``engine_server`` of a LoRA artifact with every adapter it ships served under its own name (its ``lora/``
    directories as the adapter roots)."""
    from neuronpack.backends.torch_aot import load_artifact
    from neuronpack.runtime.engine import Engine
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    engine = Engine(load_artifact(artifact), ArtifactTokenizer.from_dir(artifact))
    roots = {name: str(artifact / "lora" / name) for name in engine.adapter_names}
    return engine_server(engine, served_model_name=served_model_name, adapter_roots=roots)
