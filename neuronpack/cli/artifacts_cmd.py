"""`neuronpack inspect | verify | ls | gc`: look after the artifacts under a root."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from neuronpack.cli._console import OutputFormat, cell, print_result, stderr
from neuronpack.cli._options import EndpointOpt, FormatOpt, RootOpt, StoreOpt
from neuronpack.cli._progress import human_bytes

ArtifactArg = Annotated[Path, typer.Argument(help="an artifact directory (neuron-compiled-artifacts/<key>)")]


def _age(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f}{unit}"
    return f"{seconds:.0f}s"


def _check_duration(value: str | None) -> str | None:
    """--older-than must read as a duration: a usage error (exit 2) otherwise."""
    from neuronpack.artifacts.listing import parse_duration
    from neuronpack.errors import NeuronpackError

    if value is not None:
        try:
            parse_duration(value)
        except NeuronpackError as exc:
            raise typer.BadParameter(f"{exc.what}; {exc.fix}") from None
    return value


def inspect_command(artifact: ArtifactArg, *, output_format: FormatOpt = OutputFormat.text) -> None:
    """Show an artifact's manifest as a readable table.

    One row says what the weights are and where a quantization came from (the recipe's [quantization], or a
    checkpoint quantized before the compile); `--format json` prints the whole manifest plus `weights_precision`."""
    from neuronpack.artifacts.manifest import read_manifest
    from neuronpack.artifacts.precision import compute_dtype, weights_precision

    m = read_manifest(artifact)
    precision = weights_precision(m)
    if output_format is OutputFormat.json:
        print_result(output_format, {**m.to_json(), "weights_precision": precision.to_dict()})
        return
    from rich.table import Table

    table = Table(title=cell(artifact), show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")  # a long key folds onto the next line, never "2b22…"
    recipe = m.recipe
    section = recipe.to_dict()  # sections as the recipe file spells them
    rows = [
        ("key", m.key),
        ("model", f"{m.model.source}  ({m.model.path})"),
        ("framework", f"{m.framework}  ({m.build.get('framework_reason', '')})"),
        *_model_class_row(m),
        ("versions", ", ".join(f"{k} {v}" for k, v in sorted(m.versions.items()))),
        ("target", ", ".join(f"{k}={v}" for k, v in sorted(m.target.items()) if not isinstance(v, dict))),
        ("compute dtype", compute_dtype(m)),
        ("weights", precision.describe()),  # what they are and where a quantization came from: the one such row
        *_kv_cache_row(recipe),
        ("batch / tp", f"{recipe.target.batch_size} / {recipe.target.tp_degree}"),
        *_bucket_rows(m),
        ("max model len", str(m.serve.max_model_len)),
        ("speculation", _section_line(section.get("speculation"))),
        ("lora", _lora_line(recipe.lora)),
        ("files", f"{len(m.files)} ({human_bytes(m.total_size)})"),
        ("graphs", _graphs_line(m.graphs)),
        ("timings", ", ".join(f"{k} {v:.2f}s" for k, v in m.timings.items())),
        ("created", str(m.created_at)),
        ("accuracy", _accuracy_line(m.accuracy)),
    ]
    for field, value in rows:
        table.add_row(field, cell(value))
    print_result(output_format, None, table)


def _model_class_row(m) -> list[tuple[str, str]]:
    """nxd: the NxD Inference class the artifact was compiled with (and the renamed config keys it was given)."""
    model_class = m.compile_config.get("model_class") if m.framework == "nxd" else None
    if not model_class:
        return []
    renamed = m.compile_config.get("config_overrides")
    return [("model class", model_class + (f"  (config.json keys given as {sorted(renamed)})" if renamed else ""))]


def _bucket_rows(m) -> list[tuple[str, str]]:
    """NxDI-style buckets, or for the vLLM Neuron plugin its own bucket keys and the packaged graphs."""
    if m.framework == "vneuron":
        neuron_config = m.compile_config.get("neuron_config") or {}
        return [("prefill buckets", ", ".join(map(str, neuron_config.get("num_batched_tokens_buckets", [])))),
                ("decode batch buckets", ", ".join(map(str, neuron_config.get("num_seqs_buckets", [])))),
                ("compile-cache entries", str((m.build.get("vneuron") or {}).get("entries")))]
    return [("context buckets", ", ".join(map(str, m.buckets.context))),
            ("token-gen buckets", ", ".join(map(str, m.buckets.token_generation)))]


def _kv_cache_row(recipe) -> list[tuple[str, str]]:
    quantization = recipe.quantization
    if quantization is None or not quantization.kv_cache:
        return []
    return [("kv cache", "quantized (the recipe's [quantization] kv_cache = true)")]


def _section_line(section: dict | None) -> str:
    """A recipe section as the recipe file spells it (``kind = "eagle", length = 4``), "none" without one."""
    if not section:
        return "none"
    return ", ".join(f"{key} = {json.dumps(value)}" for key, value in section.items() if value is not None)


def _lora_line(lora) -> str:
    from neuronpack.checkpoint.lora import lora_path

    if lora is None:
        return "none"
    adapters = ", ".join(f"{a.name} ({lora_path(a.name)})" for a in lora.adapters)
    return (f"{adapters}; max_loras {lora.max_loras}, max_rank {lora.max_rank}, "
            f"{'/'.join(lora.target_modules)}")


def _graphs_line(graphs: dict | None) -> str:
    """The graph key and where the compiled graphs came from (compiled here, or a donor's: compile.md)."""
    if not graphs:
        return "no graph key (built before graph keys)"
    donor = graphs.get("from")
    if not donor:
        return f"graph key {graphs['key'][:16]}, compiled here ({graphs['seconds']:.1f} s)"
    where = donor["source"] if "://" in str(donor["source"]) else "local store"
    return (f"graph key {graphs['key'][:16]}, from {donor['key'][:16]} ({where}; {graphs['seconds']:.1f} s of "
            "compile saved)")


def _accuracy_line(accuracy: dict | None) -> str:
    if not accuracy:
        return "not checked (neuronpack eval, or compile --check-accuracy)"
    summary = accuracy.get("summary") or {}
    if not summary:
        return str(accuracy.get("status"))
    return (f"{accuracy['status']} ({accuracy.get('precision')}): top-1 {summary['top1_agreement']:.4f}, "
            f"mean KL {summary['kl_mean']:.3g}, greedy match min {summary['greedy_match_min']}/"
            f"{summary['continuation_tokens']}")


def verify_command(
    artifact: ArtifactArg,
    *,
    no_env: Annotated[
        bool, typer.Option("--no-env-check", help="skip the check that this machine's toolchain matches")
    ] = False,
    output_format: FormatOpt = OutputFormat.text,
) -> None:
    """Check an artifact's schema, key, files (size and sha256) and this machine's toolchain.

    Exit 1 naming the first problem; --no-env-check skips the toolchain."""
    from neuronpack.pipeline import verify_artifact

    m = verify_artifact(artifact, check_env=not no_env)
    print_result(output_format, {"ok": True, "path": str(artifact), "key": m.key, "files": len(m.files)},
                 f"ok: {artifact} ({len(m.files)} files, key {m.key[:16]})")


def ls_command(
    *,
    root: RootOpt = None,
    remote: StoreOpt = None,
    endpoint_url: EndpointOpt = None,
    output_format: FormatOpt = OutputFormat.text,
) -> None:
    """List the artifacts under a root (or in a remote store with --remote), newest first."""
    from neuronpack.artifacts.listing import list_artifacts
    from neuronpack.artifacts.store import artifacts_root

    if remote:
        from neuronpack.artifacts.remote import open_transport
        from neuronpack.artifacts.remote.listing import list_remote

        transport = open_transport(remote, endpoint_url=endpoint_url)
        where, rows, field = transport.url, list_remote(transport), "remote"
    else:
        where, rows, field = str(artifacts_root(root)), list_artifacts(artifacts_root(root)), "root"
    from rich.table import Table

    table = Table(title=cell(where))
    for col in ("key", "model", "framework", "weights", "buckets (ctx | tkg)", "size", "age"):
        # the labels (model, weights) wrap; the key and the figures are never cut
        label = col in ("model", "weights")
        table.add_column(col, no_wrap=not label, overflow="fold", min_width=12 if label else None)
    for r in rows:
        ctx, tkg = (",".join(map(str, r["buckets"][kind])) for kind in ("context", "token_generation"))
        buckets = f"{ctx} | {tkg}"
        table.add_row(r["key"][:16], cell(r["model"]), r["framework"], cell(r["weights_precision"]["description"]),
                      buckets, human_bytes(r["size"]), _age(r["age_seconds"]))
    print_result(output_format, {field: where, "artifacts": rows}, table)


def gc_command(
    *,
    root: RootOpt = None,
    keep: Annotated[int | None, typer.Option("--keep", min=0, help="keep only the newest N artifacts")] = None,
    older_than: Annotated[
        str | None,
        typer.Option("--older-than", callback=_check_duration, help="remove artifacts older than this (30m, 12h, 7d)"),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="list what would be removed; remove nothing")] = False,
    remote: StoreOpt = None,
    endpoint_url: EndpointOpt = None,
    output_format: FormatOpt = OutputFormat.text,
) -> None:
    """Remove old artifacts, dead builds' leftovers and failed-build logs, or old keys of a --remote store.

    Locally it also removes invalid directories and prunes digest-cache entries of files that are gone; with --remote
    it removes old keys and keys whose push never committed."""
    from neuronpack.artifacts.listing import parse_duration, plan_gc, run_gc
    from neuronpack.artifacts.store import artifacts_root

    age = parse_duration(older_than) if older_than else None
    pruned = 0
    if remote:
        from neuronpack.artifacts.remote import open_transport
        from neuronpack.artifacts.remote.listing import plan_remote_gc, run_remote_gc

        transport = open_transport(remote, endpoint_url=endpoint_url)
        remote_items = plan_remote_gc(transport, keep=keep, older_than=age)
        if not dry_run:
            run_remote_gc(transport, remote_items)
        rows = [(f"{transport.url}/{i.key}", i.kind, i.size, i.reason) for i in remote_items]
    else:
        items = plan_gc(artifacts_root(root), keep=keep, older_than=age)
        pruned = 0 if dry_run else run_gc(items)
        rows = [(str(i.path), i.kind, i.size, i.reason) for i in items]
    freed = sum(size for _, _, size, _ in rows)
    verb = "would remove" if dry_run else "removed"
    lines = "\n".join(f"{verb} {kind}: {path} ({human_bytes(size)}; {reason})" for path, kind, size, reason in rows)
    print_result(output_format, {"dry_run": dry_run, "freed_bytes": freed, "digest_cache_pruned": pruned,
                                 "removed": [{"path": path, "kind": kind, "size": size, "reason": reason}
                                             for path, kind, size, reason in rows]},
                 lines or None)
    if output_format is OutputFormat.text:
        pruned_text = f"; pruned {pruned} digest-cache entr{'y' if pruned == 1 else 'ies'}" if pruned else ""
        stderr.print(f"{verb} {len(rows)} item(s), {human_bytes(freed)}{pruned_text}", markup=False)
