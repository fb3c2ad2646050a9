"""Which artifact a server loads: vLLM's NEURON_COMPILED_ARTIFACTS semantics, made safe.

- An explicit directory: verified, then used.
- Else ``NEURON_COMPILED_ARTIFACTS``: used as-is (no hash subdirectory) when valid. When it is set but missing or
  invalid (what vLLM treats as FileNotFoundError / ValueError), compile MODEL + recipe into exactly that path, as vLLM
  does ("Failed to load the model ... Recompiling..."), but atomically; without a model to compile, a clear error.
- Neither: a clear error.
- Either one may be a remote artifact URL, ``s3://bucket/prefix/<key>`` or ``file:///path/<key>``: the artifact is
  pulled into the local root (verified file by file, installed atomically), verified again for this machine's
  toolchain, and served from there.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from neuronpack.artifacts.remote import is_remote_url, open_transport, split_artifact_url
from neuronpack.artifacts.remote.pull import pull_artifact
from neuronpack.artifacts.store import artifacts_root
from neuronpack.errors import ArtifactError, ServeError
from neuronpack.pipeline.compile import compile_model
from neuronpack.pipeline.verify import verify_artifact
from neuronpack.progress import NullReporter, Reporter

ENV = "NEURON_COMPILED_ARTIFACTS"


def resolve_serving_artifact(
    artifact_dir: str | Path | None,
    *,
    model: str | None = None,
    recipe: Path | None = None,
    overrides: Sequence[str] = (),
    reporter: Reporter | None = None,
    check_hashes: bool = True,
    root: Path | None = None,
    endpoint_url: str | None = None,
) -> Path:
    """The verified artifact directory to serve (compiling into NEURON_COMPILED_ARTIFACTS when it is invalid; pulling
    into the local root under ``root`` when given a remote URL)."""
    reporter = reporter or NullReporter()
    if is_remote_url(artifact_dir):
        return _pull_for_serving(str(artifact_dir), root, endpoint_url, reporter, check_hashes)
    if artifact_dir is not None:
        verify_artifact(Path(artifact_dir), check_hashes=check_hashes)
        return Path(artifact_dir).absolute()
    env_value = os.environ.get(ENV)
    if not env_value:
        raise ServeError(
            "no artifact to serve",
            where=f"ARTIFACT_DIR argument and ${ENV} are both unset",
            fix=f"pass ARTIFACT_DIR, or set {ENV} (with --model and --recipe to compile it when missing)",
        )
    if is_remote_url(env_value):
        return _pull_for_serving(env_value, root, endpoint_url, reporter, check_hashes)
    path = Path(env_value).expanduser().absolute()
    try:
        verify_artifact(path, check_hashes=check_hashes)
        return path
    except ArtifactError as exc:
        problem, problem_fix = exc.what, exc.fix  # its where is the path, said once below
    if model is None and recipe is None:
        raise ServeError(
            f"{ENV} is not a valid artifact: {problem}",
            where=str(path),
            fix=(f"{problem_fix}; or " if problem_fix else "")
            + "pass --model and --recipe so neuronpack can compile it there, or point the variable at an artifact",
        )
    reporter.warn(f"failed to load the artifact from {path} ({problem}); compiling into it")
    # not a user's --force: the artifact there is invalid, and a donor's graphs are checked before they are taken
    result = compile_model(model, recipe=recipe, overrides=overrides, dest=path, force=True, reuse=True,
                           reporter=reporter)
    return result.path


def _pull_for_serving(url: str, root: Path | None, endpoint_url: str | None, reporter: Reporter,
                      check_hashes: bool) -> Path:
    base, key = split_artifact_url(url)
    transport = open_transport(base, endpoint_url=endpoint_url)
    pulled = pull_artifact(transport, key, artifacts_root(root) / key, reporter=reporter)
    reporter.info(f"{'pulled' if pulled.installed else 'already local:'} {key[:16]} -> {pulled.path}")
    # A fresh pull just checked every file's sha256; the toolchain check always runs.
    verify_artifact(pulled.path, check_hashes=check_hashes and not pulled.installed)
    return pulled.path
