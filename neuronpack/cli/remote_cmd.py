"""`neuronpack push | pull`: move artifacts between the local root and a remote store (s3://, file://)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from neuronpack.cli._console import OutputFormat, RichReporter, print_json, stdout
from neuronpack.cli._options import EndpointOpt, FormatOpt, ProgressOpt, QuietOpt, RootOpt
from neuronpack.cli._progress import ProgressMode, human_bytes


def push_command(
    artifact: Annotated[Path, typer.Argument(help="an artifact directory (neuron-compiled-artifacts/<key>)")],
    remote: Annotated[str, typer.Argument(help="remote store: s3://bucket/prefix or file:///path")],
    *,
    endpoint_url: EndpointOpt = None,
    output_format: FormatOpt = OutputFormat.text,
    progress: ProgressOpt = ProgressMode.auto,
    quiet: QuietOpt = False,
) -> None:
    """Upload an artifact to <remote>/<key>/ (manifest last; a key already there is a no-op)."""
    from neuronpack.artifacts.remote import open_transport
    from neuronpack.artifacts.remote.push import push_artifact

    reporter = RichReporter(quiet=quiet, progress=progress)
    result = push_artifact(artifact, open_transport(remote, endpoint_url=endpoint_url), reporter=reporter)
    if output_format is OutputFormat.json:
        print_json(result.to_dict())
        return
    if result.pushed:
        reporter.info(f"pushed {result.files} files ({human_bytes(result.size)}) in {result.seconds:.1f} s")
    else:
        reporter.info(f"nothing to push: {result.reason}")
    stdout.print(f"{result.url}/{result.key}", markup=False, highlight=False)


def pull_command(
    key: Annotated[str, typer.Argument(help="the artifact's key (64 hex characters)")],
    *,
    remote: Annotated[str, typer.Option("--from", help="remote store: s3://bucket/prefix or file:///path")],
    root: RootOpt = None,
    endpoint_url: EndpointOpt = None,
    output_format: FormatOpt = OutputFormat.text,
    progress: ProgressOpt = ProgressMode.auto,
    quiet: QuietOpt = False,
) -> None:
    """Download an artifact by key into <root>/neuron-compiled-artifacts/<key>/.

    Files move in parallel, each checked against the manifest's size and sha256, and the artifact is installed
    atomically; an interrupted pull resumes."""
    from neuronpack.artifacts.remote import open_transport
    from neuronpack.artifacts.remote.pull import pull_artifact
    from neuronpack.artifacts.remote.transport import is_key
    from neuronpack.artifacts.store import artifacts_root

    if not is_key(key):
        raise typer.BadParameter("a key is 64 lowercase hex characters (see `neuronpack ls --remote`)",
                                 param_hint="KEY")
    reporter = RichReporter(quiet=quiet, progress=progress)
    transport = open_transport(remote, endpoint_url=endpoint_url)
    result = pull_artifact(transport, key, artifacts_root(root) / key, reporter=reporter)
    if output_format is OutputFormat.json:
        print_json(result.to_dict())
        return
    if result.installed:
        reused = f", {result.reused_files} kept from an interrupted pull" if result.reused_files else ""
        reporter.info(f"pulled {result.files} files ({human_bytes(result.size)}) in {result.seconds:.1f} s{reused}")
    else:
        reporter.info(f"already installed: {key[:16]}")
    stdout.print(str(result.path), markup=False, highlight=False)
