"""Turn what the user typed as MODEL into a local checkpoint directory: a local dir as-is, a hub id through the
Hugging Face cache (downloading only config, tokenizer and weight files), never a traceback.

Example::

    resolve_model("models/llama")                           # -> /abs/path/models/llama
    resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct@main") # -> ~/.cache/huggingface/hub/models--.../snapshots/<sha>
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from neuronpack.errors import CheckpointError, ModelNotFoundError
from neuronpack.progress import NullReporter, Reporter

# Only what a build needs: config, tokenizer/chat template, generation defaults and the weights with their index.
ALLOW_PATTERNS = [
    "*.json",
    "*.safetensors",
    "pytorch_model*.bin",
    "tokenizer.model",
    "merges.txt",
    "vocab.txt",
    "*.jinja",
    "*.tiktoken",
]
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")
_TRUE = ("1", "on", "yes", "true")


def resolve_model(source: str | Path, *, reporter: Reporter | None = None, marker: str = "config.json") -> Path:
    """Resolve MODEL to an absolute local directory.

    An existing directory is returned as-is (absolute); a ``.gguf`` file is refused with the import-gguf command to
    run first; anything else is a hub id ``org/name[@revision]`` fetched through ``huggingface_hub`` (cache first,
    ``HF_HUB_OFFLINE=1`` honoured). Offline-and-not-cached or any network failure -> ModelNotFoundError. A hub
    snapshot must hold ``marker`` (``adapter_config.json`` when resolving a LoRA adapter).

    Example::

        resolve_model("./my-model")                                # Path("/home/me/my-model")
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")       # a snapshot dir in the HF cache
    """
    reporter = reporter or NullReporter()
    text = str(source)
    path = Path(text).expanduser()
    if path.is_dir():
        return path.absolute()
    if text.lower().endswith(".gguf"):
        raise CheckpointError(
            "a GGUF file is not a Hugging Face checkpoint",
            where=text,
            fix=f"convert it first: neuronpack import-gguf {text} --out DIR, then pass DIR",
        )
    if path.exists():
        raise CheckpointError("MODEL is a file, not a checkpoint directory", where=text,
                              fix="pass the directory holding config.json and the weights")
    repo_id, revision = _split_revision(text)
    if not _looks_like_repo_id(text, repo_id):
        raise ModelNotFoundError(
            "no such local directory", where=text, fix="check the path, or pass a hub id like org/name[@revision]"
        )
    return _snapshot(repo_id, revision, reporter, marker)


def hub_offline() -> bool:
    """True when HF_HUB_OFFLINE asks for cache-only resolution (read at call time, not at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def split_hub_id(text: str) -> tuple[str, str | None] | None:
    """``"org/name@rev"`` -> ("org/name", "rev"); None when ``text`` is a path, not a hub id (no lookup is made).

    Example::

        split_hub_id("meta-llama/Llama-3.1-8B-Instruct")   # ("meta-llama/Llama-3.1-8B-Instruct", None)
        split_hub_id("./llama")                            # None
    """
    repo_id, revision = _split_revision(text)
    return (repo_id, revision) if _looks_like_repo_id(text, repo_id) else None


def _split_revision(text: str) -> tuple[str, str | None]:
    repo_id, sep, revision = text.partition("@")
    return repo_id, (revision or None) if sep else None


def _looks_like_repo_id(text: str, repo_id: str) -> bool:
    # A path-like string (./x, /x, ~/x, a/b/c) that does not exist is a typo'd path, not a hub id.
    if text.startswith((".", "/", "~")) or os.sep in repo_id.replace("/", "", 1):
        return False
    return bool(_REPO_ID.match(repo_id)) and ".." not in repo_id


def _snapshot(repo_id: str, revision: str | None, reporter: Reporter, marker: str) -> Path:
    from huggingface_hub import snapshot_download

    offline = hub_offline()
    where = repo_id + (f"@{revision}" if revision else "")
    # Read at call time: huggingface_hub freezes these at its import, which may predate the caller's settings.
    cache_dir = os.environ.get("HF_HUB_CACHE") or None
    endpoint = os.environ.get("HF_ENDPOINT") or None
    reporter.info(f"resolving {where} from the Hugging Face {'cache' if offline else 'hub'}")
    try:
        folder = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache_dir,
            allow_patterns=ALLOW_PATTERNS,
            local_files_only=offline,
            endpoint=endpoint,
        )
    except Exception as exc:  # noqa: BLE001 - every hub/network failure becomes one clear line
        raise _hub_error(exc, where, offline) from None
    folder_path = Path(str(folder))
    if not (folder_path / marker).is_file():
        raise ModelNotFoundError(
            f"the hub snapshot has no {marker}", where=f"{where} -> {folder_path}",
            fix="is this the right kind of repository (a transformers model, a PEFT adapter)? pass a local "
                "directory instead",
        )
    return folder_path.absolute()


def _hub_error(exc: Exception, where: str, offline: bool) -> ModelNotFoundError:
    kind = type(exc).__name__
    fix_cache = (
        "download it where there is network (hf download " + where.split("@")[0] + "), "
        "or pass a local checkpoint directory"
    )
    if offline or kind in ("LocalEntryNotFoundError", "OfflineModeIsEnabled"):
        return ModelNotFoundError(
            "not a local directory, and not in the local Hugging Face cache (HF_HUB_OFFLINE is set)" if offline
            else "not a local directory, and not in the local Hugging Face cache (the hub is unreachable)",
            where=where,
            fix=fix_cache,
        )
    if kind == "GatedRepoError":
        return ModelNotFoundError("model is gated: access not granted", where=where,
                                  fix="accept its license on huggingface.co and run `hf auth login`")
    if kind in ("RepositoryNotFoundError", "HFValidationError"):
        return ModelNotFoundError("no such model on the Hugging Face hub (or it is private)", where=where,
                                  fix="check the id, run `hf auth login` for private models, or pass a local path")
    if kind == "RevisionNotFoundError":
        return ModelNotFoundError("no such revision of the model", where=where, fix="check the @revision")
    first = (str(exc).strip().splitlines() or [kind])[0][:160]
    return ModelNotFoundError(f"could not download the model ({kind}: {first})", where=where, fix=fix_cache)
