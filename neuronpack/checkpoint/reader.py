"""Open a local Hugging Face checkpoint directory and read its tensors one at a time.

Layouts: ``model.safetensors``; sharded ``model.safetensors.index.json``; ``pytorch_model.bin``; sharded
``pytorch_model.bin.index.json``. Safetensors metadata is read without torch; tensors are read lazily through
``safetensors.safe_open`` (mmap), so asking for one tensor (or a few rows of it) never reads the rest.

Example::

    ckpt = open_checkpoint(Path("SmolLM2-135M"))
    ckpt.format, ckpt.tied, ckpt.lm_head_name()    # ("safetensors", True, "model.embed_tokens.weight")
    head_rows = ckpt.get_rows(ckpt.lm_head_name(), 0, 1024)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.checkpoint.safetensors_header import TensorInfo, duplicate_tensor_error, read_safetensors_header
from neuronpack.errors import CheckpointError

if TYPE_CHECKING:
    import torch

# (index file, single file, format) in order of preference.
LAYOUTS = (
    ("model.safetensors.index.json", "model.safetensors", "safetensors"),
    ("pytorch_model.bin.index.json", "pytorch_model.bin", "bin"),
)
LM_HEAD = "lm_head.weight"
EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "embed_in.weight")


def open_checkpoint(path: Path) -> Checkpoint:
    """Open a local HF checkpoint directory (config.json + weights); raise CheckpointError if it is not usable.

    Example::

        ckpt = open_checkpoint(Path("models/llama"))
        for name, tensor in ckpt.iter_tensors():
            ...
    """
    return Checkpoint(Path(path))


class Checkpoint:
    """A local checkpoint directory: its config, weight files and a lazy, per-tensor reader."""

    def __init__(self, root: Path) -> None:
        root = Path(root).expanduser()
        if not root.is_dir():
            what = "checkpoint path is not a directory" if root.exists() else "checkpoint directory does not exist"
            raise CheckpointError(what, where=str(root), fix="pass a local Hugging Face model directory")
        self.root = root.absolute()
        self.config: dict = _read_config(self.root)
        self.format, self.files, self._index = _find_weight_files(self.root)
        self._infos: dict[str, TensorInfo] | None = None
        self._bin_tensors: dict[str, torch.Tensor] | None = None
        self._handles: dict[Path, Any] = {}
        if self.format == "safetensors":
            self._infos = _safetensors_infos(self.files, self._index)
        self.tied: bool = self._is_tied()

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.root)!r}, format={self.format!r}, files={len(self.files)})"

    # --- metadata -----------------------------------------------------------------------------------------------
    def names(self) -> list[str]:
        """Tensor names in storage order (file by file, by offset), the cheapest order to read them in."""
        return list(self._all_infos())

    def info(self, name: str) -> TensorInfo:
        """Name, dtype (safetensors spelling), shape, file and byte size of one tensor, without reading it."""
        infos = self._all_infos()
        if name not in infos:
            raise self._missing(name)
        return infos[name]

    def lm_head_name(self) -> str:
        """``lm_head.weight``, or the input embedding for tied models (which have no lm_head of their own)."""
        names = self._all_infos()
        if LM_HEAD in names:
            return LM_HEAD
        embedding = self.embedding_name()
        if self.tied and embedding:
            return embedding
        raise CheckpointError(
            "checkpoint has no lm_head.weight and its embeddings are not tied",
            where=str(self.root),
            fix="use a causal-LM checkpoint that includes its output projection",
        )

    def weight_identity(self) -> list[list]:
        """``[[name, dtype, shape], ...]`` sorted by name: what the artifact key hashes (torch-free for safetensors)."""
        return [[i.name, i.dtype, list(i.shape)] for i in sorted(self._all_infos().values(), key=lambda i: i.name)]

    # --- data ---------------------------------------------------------------------------------------------------
    def get(self, name: str) -> torch.Tensor:
        """Read one tensor (only its bytes) as a CPU tensor owned by the caller."""
        info = self.info(name)
        if self.format == "bin":
            return self._bin()[name].clone()
        return self._handle(info.file).get_tensor(name)

    def get_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start:stop]`` (dim 0) of a tensor, reading only those rows.

        Example: ``ckpt.get_rows("lm_head.weight", 0, 4096)`` -> ``[4096, hidden]``.
        """
        info = self.info(name)
        rows = info.shape[0] if info.shape else 0
        if not info.shape or not 0 <= start <= stop <= rows:
            raise ValueError(f"rows [{start}:{stop}] out of range for {name} with shape {info.shape}")
        if self.format == "bin":
            return self._bin()[name][start:stop].clone()
        return self._handle(info.file).get_slice(name)[start:stop]

    def raw_rows(self, name: str, start: int, stop: int, *, into: bytearray | None = None) -> bytes | memoryview:
        """The stored bytes of rows ``[start:stop]`` of a safetensors tensor, read with one ``pread`` (no torch);
        with ``into`` (large enough), read into it and returned as a view of its first bytes (no allocation).

        Example: ``ckpt.raw_rows("lm_head.weight", 0, 4)`` -> ``4 * hidden * itemsize`` bytes.
        """
        info = self.info(name)
        rows = info.shape[0] if info.shape else 0
        if self.format != "safetensors" or info.offset is None or not 0 <= start <= stop <= rows:
            raise ValueError(f"no stored rows [{start}:{stop}] of {name} ({self.format}, shape {info.shape})")
        row_bytes = info.nbytes // rows if rows else 0
        size, offset = (stop - start) * row_bytes, info.offset + start * row_bytes
        if into is not None and len(into) < size:
            raise ValueError(f"a buffer of {len(into)} bytes cannot hold rows [{start}:{stop}] of {name} ({size})")
        with open(info.file, "rb") as fh:
            if into is None:
                data = os.pread(fh.fileno(), size, offset)
                got = len(data)
            else:
                data = memoryview(into)[:size]
                got = os.preadv(fh.fileno(), [data], offset) if size else 0
        if got != size:
            raise CheckpointError(f"{info.file.name} ends inside {name}", where=str(info.file),
                                  fix="re-download the checkpoint (the file was truncated or changed)")
        return data

    def iter_tensors(self, names: Iterable[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, tensor)`` one at a time (all tensors in storage order when ``names`` is None)."""
        for name in self.names() if names is None else names:
            yield name, self.get(name)

    # --- internals ----------------------------------------------------------------------------------------------
    def _all_infos(self) -> dict[str, TensorInfo]:
        if self._infos is None:
            from neuronpack.checkpoint import bin_loader

            self._infos = bin_loader.tensor_infos(self._bin(), self._bin_files_by_name)
        return self._infos

    def _bin(self) -> dict[str, torch.Tensor]:
        if self._bin_tensors is None:
            from neuronpack.checkpoint import bin_loader  # .bin only (it imports pickle)

            self._bin_tensors, self._bin_files_by_name = bin_loader.load_bin_files(self.files)
            if self._index is not None:
                _check_index_matches(self._index, self._bin_files_by_name, self.root)
        return self._bin_tensors

    def _handle(self, file: Path) -> Any:
        if file not in self._handles:
            from safetensors import safe_open

            self._handles[file] = safe_open(str(file), framework="pt", device="cpu")
        return self._handles[file]

    def embedding_name(self) -> str | None:
        """The input embedding's tensor name (``model.embed_tokens.weight`` and its kin), or None."""
        names = self._all_infos()
        for suffix in EMBEDDING_SUFFIXES:
            for name in names:
                if name.endswith(suffix):
                    return name
        return None

    def _is_tied(self) -> bool:
        configs = [self.config, self.config.get("text_config") or {}]
        if any(isinstance(c, dict) and c.get("tie_word_embeddings") is True for c in configs):
            return True
        if self.format == "bin" and self._infos is None:
            # .bin names need a (mmap) load; only pay for it when the config does not say.
            if "tie_word_embeddings" in self.config:
                return False
        return LM_HEAD not in self._all_infos() and self.embedding_name() is not None

    def _missing(self, name: str) -> CheckpointError:
        close = [n for n in self._all_infos() if name.rsplit(".", 1)[0] in n][:3]
        hint = f"did you mean {', '.join(close)}?" if close else "list names with Checkpoint.names()"
        return CheckpointError(f"no tensor named {name!r} in checkpoint", where=str(self.root), fix=hint)


def _read_config(root: Path) -> dict:
    path = root / "config.json"
    if not path.is_file():
        raise CheckpointError(
            "config.json is missing", where=str(root), fix="a Hugging Face checkpoint needs its config.json beside "
            "the weights (save it with model.config.save_pretrained(dir))"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"config.json is not valid JSON ({exc})", where=str(path), fix="fix or re-download it")\
            from None
    if not isinstance(config, dict):
        raise CheckpointError("config.json is not a JSON object", where=str(path), fix="fix or re-download it")
    return config


def _find_weight_files(root: Path) -> tuple[str, list[Path], dict[str, str] | None]:
    """Return (format, weight files in shard order, weight_map or None)."""
    for index_name, single_name, fmt in LAYOUTS:
        if (root / index_name).is_file():
            weight_map = _read_index(root / index_name)
            # Shard names sort in their numbered order (model-00001-of-00003, ...); weight_map is sorted by tensor.
            files = [root / f for f in sorted(set(weight_map.values()))]
            for file in files:
                if not file.is_file():
                    raise CheckpointError(
                        f"index names a missing shard {file.name}",
                        where=str(root / index_name),
                        fix="re-download the checkpoint: every shard listed in the index must be present",
                    )
            return fmt, files, weight_map
        if (root / single_name).is_file():
            return fmt, [root / single_name], None
    present = sorted(p.name for p in root.iterdir())[:8]
    raise CheckpointError(
        "no weight files found (model.safetensors[.index.json] or pytorch_model.bin[.index.json])",
        where=f"{root}, contains {present}",
        fix="download the weights too, or point to the directory that holds them",
    )


def _read_index(path: Path) -> dict[str, str]:
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"index is not valid JSON ({exc})", where=str(path), fix="re-download it") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError("index has no weight_map object", where=str(path), fix="re-download it")
    for shard in weight_map.values():
        if Path(shard).name != shard:
            raise CheckpointError(f"index names a shard outside the directory: {shard!r}", where=str(path),
                                  fix="shard names must be plain file names")
    return weight_map


def _safetensors_infos(files: list[Path], weight_map: dict[str, str] | None) -> dict[str, TensorInfo]:
    infos: dict[str, TensorInfo] = {}
    for file in files:
        for name, info in read_safetensors_header(file).items():
            if name in infos:
                raise duplicate_tensor_error(name, infos[name].file, file)
            infos[name] = info
    if weight_map is not None:
        _check_index_matches(weight_map, {n: i.file for n, i in infos.items()}, files[0].parent)
    return infos


def _check_index_matches(weight_map: dict[str, str], file_of: dict[str, Path], root: Path) -> None:
    for name, shard in weight_map.items():
        actual = file_of.get(name)
        if actual is None or actual.name != shard:
            raise CheckpointError(
                f"index places {name!r} in {shard} but that shard does not hold it",
                where=str(root),
                fix="the index and shards disagree; re-download or re-export the checkpoint",
            )
