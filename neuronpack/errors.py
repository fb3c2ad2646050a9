"""One error family. Domain code raises these; only the CLI turns them into one line and exit code 1.

Every error carries what went wrong, where (a file, a key, a tensor) and how to fix it, as fields, so the CLI can
print ``error: <what> (<where>). <fix>`` and tests can assert on the fields.
"""

from __future__ import annotations


class NeuronpackError(Exception):
    """Base class: a user-facing problem with the input or environment (exit code 1)."""

    exit_code = 1

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None) -> None:
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(self.one_line())

    def one_line(self) -> str:
        text = self.what
        if self.where:
            text += f" ({self.where})"
        if self.fix:
            text += f". {self.fix}"
        return text.replace("\n", " ")


class RecipeError(NeuronpackError):
    """A recipe file or a --set override is invalid."""


class BucketError(NeuronpackError):
    """A bucket plan is inconsistent, or a length does not fit any bucket."""


class TrafficError(NeuronpackError):
    """A request log (``buckets plan --traffic``) is unreadable, empty or malformed."""


class CheckpointError(NeuronpackError):
    """A model checkpoint is missing, malformed or unsafe."""


class ModelNotFoundError(CheckpointError):
    """A model id or path could not be resolved (e.g. offline and not cached)."""


class OutputExistsError(NeuronpackError):
    """An output path already exists and would be overwritten."""


class ArtifactError(NeuronpackError):
    """A compiled artifact directory is missing, incomplete, corrupted or built by another toolchain."""


class RemoteError(NeuronpackError):
    """A remote artifact store (s3://, file://) is unreachable, refuses access, or lacks what was asked for."""


class BuildError(NeuronpackError):
    """A backend failed while compiling."""


class BackendUnavailableError(NeuronpackError):
    """The requested framework cannot run here (package missing, placeholder, no compiler)."""


class ConversionError(NeuronpackError):
    """convert-eagle refused its inputs."""


class QuantizationError(NeuronpackError):
    """quantize refused its inputs."""


class ServeError(NeuronpackError):
    """The server or runtime cannot start or answer with what it was given. The HTTP server answers 500 for every
    ServeError that is not an InvalidRequestError: the fault is on the server's side, not the client's."""


class TokenizerError(ServeError):
    """The artifact's tokenizer or chat template is missing, unreadable or broken (a server fault: HTTP 500)."""


class AccuracyError(NeuronpackError):
    """An accuracy check cannot run with what it was given (prompts file, reference checkpoint, artifact)."""


class UnsupportedModelError(NeuronpackError):
    """The checkpoint's architecture or a config field is not supported by the portable (torch) model code."""


class InvalidRequestError(ServeError):
    """One generation request cannot be served as given (the HTTP server answers 400 with this message).

    ``param`` names the offending request field (OpenAI's error ``param``), e.g. "max_tokens" or "messages".
    """

    def __init__(self, what: str, *, param: str | None = None, where: str | None = None, fix: str | None = None):
        self.param = param
        super().__init__(what, where=where, fix=fix)


class ServerBusyError(ServeError):
    """The server cannot take a request now: its waiting queue is full or it is shutting down (HTTP 503)."""
