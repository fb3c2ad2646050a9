"""The non-weight files that travel with a checkpoint (tokenizer, chat template, generation defaults).

Example::

    copy_aux_files(Path("models/llama"), staging)   # ["tokenizer.json", "tokenizer_config.json", ...]
"""

from __future__ import annotations

import shutil
from pathlib import Path

AUX_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "generation_config.json",
)


def copy_aux_files(src: Path, dst: Path) -> list[str]:
    """Copy each of AUX_FILES that exists in ``src`` into ``dst``; return the names copied, in AUX_FILES order.

    Example::

        copy_aux_files(Path("draft"), Path("out"))   # ["tokenizer.json", "generation_config.json"]
    """
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in AUX_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    return copied
