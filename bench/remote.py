"""Remote store throughput: `push` / `pull` of the demo artifact vs a plain copy of the same files, and a compile that
hits the remote store vs a local cache hit, against a local S3 server (moto on 127.0.0.1), in one run.

The plain copy uses the same client library (boto3 / s3transfer), the same transfer settings and the same number of
files in flight; push and pull add what makes them safe (sha256 of every file, the lease, the manifest last, staging,
fsync, the atomic rename). Target: push and pull throughput >= 0.8x the plain copy.

    .venv/bin/python -m bench.remote [--model .demo/SmolLM2-135M-Instruct] [--compiler aoti|export] [--rounds 1]

(An export-only artifact is ~3.5 GB: each graph carries its own copy of the weights; AOTInductor's is ~0.6 GB.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from bench._common import NEURONPACK, ROOT, bench_parser, figure, median, model_checkpoint, save_results
from tests.helpers.moto_s3 import MotoServer

RECIPE = ROOT / "recipes" / "smollm2-135m-cpu.toml"


def load() -> list[float]:
    """The 1/5/15-minute load averages (the machine is shared: read every figure with them)."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


SETS: list[str] = []


def compile_argv(model: Path, root: Path, compiler: str, *extra: str) -> list[str]:
    sets = [arg for s in SETS for arg in ("--set", s)]
    return [*NEURONPACK, "compile", str(model), "--recipe", str(RECIPE), "--set", f"compiler={compiler}", *sets,
            "--out-root", str(root), "--format", "json", "--progress", "none", *extra]


def plain_upload(client, bucket: str, prefix: str, artifact: Path) -> None:
    from neuronpack.artifacts.remote.push import FILE_WORKERS
    from neuronpack.artifacts.remote.s3 import transfer_config
    from neuronpack.artifacts.remote.transport import run_parallel

    config = transfer_config()
    files = sorted((p for p in artifact.rglob("*") if p.is_file()), key=lambda p: -p.stat().st_size)
    run_parallel([lambda p=p: client.upload_file(str(p), bucket, f"{prefix}/{p.relative_to(artifact).as_posix()}",
                                                 Config=config) for p in files], FILE_WORKERS)


def plain_download(client, bucket: str, prefix: str, dest: Path) -> None:
    from neuronpack.artifacts.remote.pull import FILE_WORKERS
    from neuronpack.artifacts.remote.s3 import transfer_config
    from neuronpack.artifacts.remote.transport import run_parallel

    config = transfer_config()
    objects = client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]

    def get(key: str) -> None:
        target = dest / key[len(prefix) + 1:]
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, key, str(target), Config=config)

    run_parallel([lambda k=o["Key"]: get(k) for o in objects], FILE_WORKERS)


def _delete_prefix(client, bucket: str, prefix: str) -> None:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        objects = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if objects:
            client.delete_objects(Bucket=bucket, Delete={"Objects": objects})


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = bench_parser("remote", __doc__, model="smollm2", rounds=1)
    parser.add_argument("--compiler", default="aoti", choices=["aoti", "export"])
    parser.add_argument("--set", dest="sets", action="append", default=[],
                        help="extra recipe override for the compile (repeatable), e.g. model.dtype=bfloat16")
    args = parser.parse_args()

    SETS.extend(args.sets)
    work = args.workdir.absolute()  # keeps the model copy and the compiled artifact between runs
    work.mkdir(parents=True, exist_ok=True)
    model = work / "SmolLM2-135M-Instruct-copy"  # a copy: the digest cache sees files of its own
    if not (model / "config.json").exists():
        shutil.copytree(model_checkpoint(args), model)
    env = {**os.environ, "NEURONPACK_CACHE_DIR": str(work / "cache"), "AWS_ACCESS_KEY_ID": "bench",
           "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    env.pop("AWS_PROFILE", None)
    t0 = time.perf_counter()
    built = json.loads(subprocess.run(compile_argv(model, work / "builder", args.compiler), check=True,
                                      capture_output=True, text=True, env=env).stdout)
    print(f"artifact {built['key'][:16]}: {built['files']} files, {built['size'] / 1e6:.0f} MB "
          f"({'cache hit' if built['cache_hit'] else f'compiled in {time.perf_counter() - t0:.0f} s'})")
    artifact = Path(built["path"])
    size = built["size"]
    loads = {"start": load()}

    with MotoServer() as server:
        env["AWS_ENDPOINT_URL"] = server.endpoint
        os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                                               "AWS_ENDPOINT_URL")})
        os.environ.pop("AWS_PROFILE", None)
        server.create_bucket("bench")
        from neuronpack.artifacts.remote import open_transport
        from neuronpack.artifacts.remote.pull import pull_artifact
        from neuronpack.artifacts.remote.push import push_artifact
        from neuronpack.artifacts.remote.s3 import make_client

        client = make_client()
        rows = {"copy_up": [], "push": [], "copy_down": [], "pull": []}
        for i in range(args.rounds):
            store = open_transport(f"s3://bench/push{i}")
            rows["copy_up"].append(timed(lambda i=i: plain_upload(client, "bench", f"plain{i}", artifact)))
            rows["push"].append(timed(lambda s=store: push_artifact(artifact, s)))
            down = work / f"down{i}"
            shutil.rmtree(down, ignore_errors=True)
            rows["pull"].append(timed(lambda s=store, d=down: pull_artifact(s, built["key"], d / built["key"])))
            rows["copy_down"].append(timed(lambda i=i, d=down: plain_download(client, "bench", f"plain{i}",
                                                                              d / "plain")))
            shutil.rmtree(down, ignore_errors=True)
            _delete_prefix(client, "bench", f"plain{i}")  # the server keeps objects on local disk: bound it
            if i < args.rounds - 1:
                _delete_prefix(client, "bench", f"push{i}")
        loads["after_transfers"] = load()

        # A compile on another machine: the remote store has the key (pulled) vs the local root has it (hit).
        remote = f"s3://bench/push{args.rounds - 1}"
        hit_remote, hit_local = [], []
        for i in range(args.rounds):
            argv = compile_argv(model, work / f"pod{i}", args.compiler, "--remote", remote)
            t0 = time.perf_counter()
            out = json.loads(subprocess.run(argv, check=True, capture_output=True, text=True, env=env).stdout)
            hit_remote.append(time.perf_counter() - t0)
            assert out["remote_hit"], out
            t0 = time.perf_counter()
            out = json.loads(subprocess.run(compile_argv(model, work / "builder", args.compiler), check=True,
                                            capture_output=True, text=True, env=env).stdout)
            hit_local.append(time.perf_counter() - t0)
            assert out["cache_hit"] and not out["remote_hit"], out
            shutil.rmtree(work / f"pod{i}", ignore_errors=True)
        loads["end"] = load()

    med = {k: median(v) for k, v in rows.items()}
    mbps = {k: size / v / 1e6 for k, v in med.items()}
    ratios = {"push_vs_copy": med["copy_up"] / med["push"], "pull_vs_copy": med["copy_down"] / med["pull"]}
    hits = {"remote_hit": median(hit_remote), "local_hit": median(hit_local)}
    print(f"\n{'transfer':<28} {'median s':>9} {'MB/s':>8}")
    for name, label in (("copy_up", "plain upload (boto3)"), ("push", "neuronpack push"),
                        ("copy_down", "plain download (boto3)"), ("pull", "neuronpack pull")):
        print(f"{label:<28} {med[name]:>9.2f} {mbps[name]:>8.1f}")
    print(f"push / plain upload throughput:   {ratios['push_vs_copy']:.2f}x  (goal >= 0.8x)")
    print(f"pull / plain download throughput: {ratios['pull_vs_copy']:.2f}x  (goal >= 0.8x)")
    print(f"compile, remote hit (pull {size / 1e6:.0f} MB): {hits['remote_hit']:.2f} s;  local cache hit: "
          f"{hits['local_hit']:.2f} s  ({hits['remote_hit'] / hits['local_hit']:.1f}x)")
    print(f"load average (1/5/15 min): {loads}")
    save_results("remote", {
        "repeats": args.rounds,
        "compiler": args.compiler,
        "recipe_overrides": args.sets,
        "artifact": {"key": built["key"], "files": built["files"], "bytes": size},
        "server": "moto (python -m moto.server) on 127.0.0.1, in-memory",
        "client": "boto3 / s3transfer",
        "seconds": {k: v for k, v in rows.items()},
        "median_seconds": med,
        "throughput_mb_s": mbps,
        "ratios": ratios,
        "compile_hit_seconds": {"remote": hit_remote, "local": hit_local,
                                **{f"median_{k}": v for k, v in hits.items()}},
        "load_average": loads,
        "targets": {"push_vs_copy": 0.8, "pull_vs_copy": 0.8},
    })
    _plot(mbps, ratios, hits)


def _plot(mbps: dict, ratios: dict, hits: dict) -> None:
    with figure("remote", figsize=(10, 3.8), ncols=2, gridspec_kw={"width_ratios": [2, 1]}) as (_, (left, right)):
        labels = ["plain upload", "push", "plain download", "pull"]
        bars = left.bar(labels, [mbps["copy_up"], mbps["push"], mbps["copy_down"], mbps["pull"]],
                        color=["#9bb7d4", "#4a7ab5", "#9bb7d4", "#4a7ab5"])
        left.bar_label(bars, fmt="%.0f")
        left.set_ylabel("MB/s (median)")
        left.set_title(f"push {ratios['push_vs_copy']:.2f}x, pull {ratios['pull_vs_copy']:.2f}x a plain boto3 copy")
        bars = right.bar(["local hit", "remote hit"], [hits["local_hit"], hits["remote_hit"]], color="#4a7ab5")
        right.bar_label(bars, fmt="%.2f")
        right.set_ylabel("seconds (median)")
        right.set_title("compile: cache hit")


if __name__ == "__main__":
    main()
