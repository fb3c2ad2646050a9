"""Remote artifact stores (s3://, file://): push, pull, list and gc artifacts by key. See transport.py."""

from __future__ import annotations

from neuronpack.artifacts.remote.transport import REMOTE_ENV, Transport, is_remote_url, split_artifact_url
from neuronpack.errors import RemoteError

__all__ = ["REMOTE_ENV", "Transport", "is_remote_url", "open_transport", "split_artifact_url"]


def open_transport(url: str, *, endpoint_url: str | None = None) -> Transport:
    """The transport for ``s3://bucket[/prefix]`` or ``file:///path``; RemoteError for anything else."""
    if url.startswith("s3://"):
        from neuronpack.artifacts.remote.s3 import S3Transport

        return S3Transport(url, endpoint_url=endpoint_url)
    if url.startswith("file://"):
        from neuronpack.artifacts.remote.filesystem import FileTransport

        return FileTransport(url)
    raise RemoteError(f"unsupported remote store {url!r}", where="--remote",
                      fix="use s3://bucket/prefix (any S3-compatible service) or file:///path (a shared filesystem)")
