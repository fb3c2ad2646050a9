"""Remote artifact stores (s3://, file://): push, pull, list and gc artifacts by key. See transport.py."""

from neuronpack.artifacts.remote.transport import REMOTE_ENV, is_remote_url, open_transport, split_artifact_url

__all__ = ["REMOTE_ENV", "is_remote_url", "open_transport", "split_artifact_url"]
