"""Third-party clients against ``neuronpack serve``: lm-evaluation-harness (multiple-choice loglikelihoods through
``local-completions``, compared with lm-eval's own ``hf`` model on the same checkpoint) and guidellm (synthetic load).
Shared by the smoke tests (tiny model, a few examples) and ``bench/eval_clients.py`` (``make eval-clients``).

Example::

    served, reference = run_lm_eval([("local-completions", local_completions_args(url, "tiny", ckpt)),
                                     ("hf", hf_args(ckpt))], tmp_path, limit=4)
    served.acc == reference.acc
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

TASK_DIR = Path(__file__).parents[1] / "data" / "lm_eval"
TASK = "neuronpack_mc"


@dataclass
class LmEvalRun:
    acc: float
    loglikelihoods: list[list[float]]  # per document (in doc order), per choice
    is_greedy: list[list[bool]]


def task_include_dir(out: Path) -> Path:
    """The shipped task YAML with its JSONL path made absolute (lm-eval resolves data files from the cwd)."""
    out.mkdir(parents=True, exist_ok=True)
    text = (TASK_DIR / f"{TASK}.yaml").read_text()
    text = text.replace(f"test: {TASK}.jsonl", f"test: {TASK_DIR / f'{TASK}.jsonl'}")
    (out / f"{TASK}.yaml").write_text(text)
    return out


def local_completions_args(base_url: str, model: str, tokenizer_dir: Path, *, api_key: str | None = None,
                           num_concurrent: int = 1) -> str:
    """lm-eval's ``local-completions`` model against our server: token-id prompts, the checkpoint's tokenizer.
    (lm-eval's ``batch_size`` becomes the number of prompts per request.)"""
    args = {"base_url": f"{base_url}/v1/completions", "model": model, "tokenizer": str(tokenizer_dir),
            "tokenizer_backend": "huggingface", "tokenized_requests": True, "num_concurrent": num_concurrent,
            "max_retries": 1, "timeout": 600}
    if api_key:
        args["auth_token"] = api_key
    return ",".join(f"{k}={v}" for k, v in args.items())


def hf_args(checkpoint: Path) -> str:
    return f"pretrained={checkpoint},dtype=float32,device=cpu"


def run_lm_eval(runs: list[tuple[str, str]], work: Path, *, limit: int | None = None, batch_size: int = 1
                ) -> list[LmEvalRun]:
    """Run lm-eval on the shipped task for each (model, model_args), one after the other in one fresh interpreter
    (lm-eval configures logging and datasets globally; its imports are paid once). Returns, per run, accuracy and
    every (document, choice) loglikelihood."""
    include = task_include_dir(work / "task")
    out = work / "lm-eval-runs.json"
    code = f"""
import json
import lm_eval
from lm_eval.tasks import TaskManager
runs = []
for model, model_args in {runs!r}:
    res = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[{TASK!r}], limit={limit!r},
                                  batch_size={batch_size!r}, log_samples=True,
                                  task_manager=TaskManager(include_path={str(include)!r}))
    samples = sorted(res["samples"][{TASK!r}], key=lambda s: s["doc_id"])
    runs.append({{"acc": res["results"][{TASK!r}]["acc,none"],
                 "lls": [[r[0][0] for r in s["resps"]] for s in samples],
                 "greedy": [[r[0][1] for r in s["resps"]] for s in samples]}})
json.dump(runs, open({str(out)!r}, "w"))
"""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_DATASETS_CACHE": str(work / "datasets-cache"), "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "x")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"lm-eval failed:\n{done.stderr[-4000:]}")
    return [LmEvalRun(r["acc"], r["lls"], r["greedy"]) for r in json.loads(out.read_text())]


def run_guidellm(target: str, model: str, tokenizer_dir: Path, out_json: Path, *, profile: str = "kind=synchronous",
                 max_requests: int = 4, prompt_tokens: int = 32, output_tokens: int = 16,
                 overrides: tuple[str, ...] = ()) -> list[dict]:
    """``guidellm run`` (its CLI, as a user runs it) with synthetic prompts against ``target``; the full report goes
    to ``out_json``. Returns one summary per benchmark (strategy, request counts, throughput, latencies)."""
    argv = [str(Path(sys.executable).parent / "guidellm"), "run",
            "--backend", f"kind=openai_http,target={target},model={model}",
            "--profile", profile,
            "--constraint", f"kind=max_requests,count={max_requests}",
            "--tokenizer", f"kind=huggingface_auto,model={tokenizer_dir}",
            "--data", f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={output_tokens}",
            "--output", f"kind=json,path={out_json}", "--disable-console-interactive"]
    for override in overrides:
        argv += ["--override", *override.split(" ", 1)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=7200)
    if done.returncode != 0:
        raise RuntimeError(f"guidellm failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return guidellm_summary(json.loads(out_json.read_text()))


def guidellm_summary(report: dict) -> list[dict]:
    """The numbers worth reading from a guidellm report, one dict per benchmark."""
    rows = []
    for bench in report["benchmarks"]:
        m = bench["metrics"]

        def ok(name: str, stat: str = "median", m=m) -> float:
            return m[name]["successful"][stat]

        strategy = bench["config"]["strategy"]
        rows.append({
            "strategy": strategy["type_"],
            "max_concurrency": strategy.get("max_concurrency") or strategy.get("streams"),
            "requests": m["request_totals"],
            "requests_per_s": ok("requests_per_second", "mean"),
            "output_tokens_per_s": ok("output_tokens_per_second", "mean"),
            "concurrency_mean": ok("request_concurrency", "mean"),
            "ttft_ms_p50": ok("time_to_first_token_ms"),
            "ttft_ms_p99": m["time_to_first_token_ms"]["successful"]["percentiles"]["p99"],
            "itl_ms_p50": ok("inter_token_latency_ms"),
            "latency_s_p50": ok("request_latency"),
            "output_tokens_per_request": ok("output_token_count"),
        })
    return rows
