"""`neuronpack compile`: build (or reuse) a content-addressed artifact."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from neuronpack.cli._console import OutputFormat, RichReporter, print_result, stderr
from neuronpack.cli._options import (
    EndpointOpt,
    FormatOpt,
    ProgressOpt,
    QuietOpt,
    RemoteOpt,
    RootOpt,
    SetOpt,
    check_plain_text,
)
from neuronpack.cli._progress import ProgressMode


class FrameworkChoice(str, Enum):
    auto = "auto"
    nxd = "nxd"
    tnx = "tnx"
    vneuron = "vneuron"
    torch = "torch"


def compile_command(
    model: Annotated[
        str | None, typer.Argument(help="HF checkpoint dir or hub id (default: the recipe's model.source)",
                                    callback=check_plain_text)
    ] = None,
    *,
    recipe: Annotated[Path | None, typer.Option("--recipe", "-r", help="TOML recipe (see recipes/)")] = None,
    framework: Annotated[
        FrameworkChoice | None, typer.Option("--framework", help="override the recipe's framework")
    ] = None,
    root: RootOpt = None,
    set_: SetOpt = None,
    force: Annotated[
        bool, typer.Option("--force", help="rebuild from scratch even when a valid artifact exists: every graph is "
                           "compiled here (add --reuse to take them from an artifact of the same graph key)")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print the resolved configuration and key; build nothing")
    ] = False,
    check_accuracy: Annotated[
        bool, typer.Option("--check-accuracy", help="compare the build with the checkpoint (like `neuronpack eval`) "
                           "and record the figures in the manifest; exit 1 when it fails, 3 when it cannot run here")
    ] = False,
    remote: RemoteOpt = None,
    push: Annotated[bool, typer.Option("--push", help="publish the artifact to --remote after the build")] = False,
    reuse: Annotated[
        bool | None, typer.Option("--reuse/--no-reuse", help="take the compiled graphs of an artifact with the same "
                                  "graph key (same shapes, config, recipe and toolchain) when there is one, or "
                                  "compile every graph (default: --reuse; with --force: --no-reuse)",
                                  show_default=False)
    ] = None,
    endpoint_url: EndpointOpt = None,
    output_format: FormatOpt = OutputFormat.text,
    progress: ProgressOpt = ProgressMode.auto,
    quiet: QuietOpt = False,
) -> None:
    """Compile MODEL with a recipe into <root>/neuron-compiled-artifacts/<key>/.

    A cache hit returns the artifact at once; with --remote, a key stored there is pulled instead of built."""
    from neuronpack.pipeline import compile_model

    reporter = RichReporter(quiet=quiet, progress=progress)
    transport = None
    if remote:
        from neuronpack.artifacts.remote import open_transport

        transport = open_transport(remote, endpoint_url=endpoint_url)
    result = compile_model(
        model,
        recipe=recipe,
        overrides=set_ or [],
        framework=framework.value if framework else None,
        out_root=root,
        force=force,
        dry_run=dry_run,
        check_accuracy=check_accuracy,
        reporter=reporter,
        remote=transport,
        push=push,
        reuse=reuse,
    )
    if dry_run:
        payload = {"dry_run": True, "framework": result.framework, "framework_reason": result.framework_reason,
                   "key": result.key, "path": str(result.path), **result.compile_config}
        if result.in_remote is not None:
            payload["in_remote"] = result.in_remote
        print_result(output_format, payload, json.dumps(payload, indent=2, sort_keys=True, default=str))
        return
    manifest = result.manifest_json  # as on disk: reading it typed would import pydantic on every cache hit
    summary = {
        "path": str(result.path),
        "key": result.key,
        "cache_hit": result.cache_hit,
        "remote_hit": result.remote_hit,
        "pushed": result.pushed,
        "framework": result.framework,
        "framework_reason": result.framework_reason,
        "buckets": manifest["buckets"],
        "files": len(manifest["files"]),
        "size": sum(f["size"] for f in manifest["files"]),
        # seconds to the millisecond, as the manifest records them (a hit's own timings were printed raw)
        "timings": {k: round(v, 3) for k, v in (result.timings if result.cache_hit else
                                                manifest.get("timings", {})).items()},
        **({"accuracy": result.accuracy} if result.accuracy else {}),
        "graphs_from": result.graphs_from,
    }
    if output_format is OutputFormat.text:
        if result.pushed is not None:
            reporter.info(f"push: {result.pushed['reason']} ({result.pushed['url']})")
        if result.remote_hit:
            reporter.info(f"remote hit: pulled {result.key[:16]} in {result.timings.get('pull', 0.0):.1f} s")
        elif result.cache_hit:
            reporter.info(f"cache hit: {result.key[:16]} (built {manifest.get('created_at') or '?'})")
        elif (donor := result.graphs_from) is not None:
            reporter.info(f"built {result.key[:16]} in {result.timings.get('build', 0.0):.1f} s with the compiled "
                          f"graphs of {donor['key'][:16]} ({donor['files']} file{'s' if donor['files'] != 1 else ''}; "
                          f"{donor['compile_seconds_saved']:.1f} s of compile saved)")
        else:
            reporter.info(f"built {result.key[:16]} in {result.timings.get('build', 0.0):.1f} s")
        if result.accuracy:
            from neuronpack.cli._accuracy_report import print_report

            print_report(result.accuracy, str(result.path), console=stderr)  # stdout stays the path alone
    print_result(output_format, summary, str(result.path))
    if result.accuracy:
        from neuronpack.cli._accuracy_report import exit_code

        if exit_code(result.accuracy):
            raise typer.Exit(exit_code(result.accuracy))
