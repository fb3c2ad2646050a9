"""A tiny random Llama checkpoint (2 layers, hidden 64, its own 384-token tokenizer and chat template), for a reader
to run the examples of docs/neuron.md and docs/remote.md from a checkout without downloading a model:

    python tools/tiny_llama.py tiny-llama

It is the test suite's own fixture (tests/helpers/tiny_models.py), seeded: a directory that already holds it is kept.
Random weights: it shows what a command does, not text.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.tiny_models import make_tiny_checkpoint  # noqa: E402


def main(out: Path) -> None:
    import transformers

    transformers.utils.logging.disable_progress_bar()  # stdout is the path, stderr stays quiet
    if not (out / "config.json").is_file():  # seeded: a second run would write the same files
        make_tiny_checkpoint(out, arch="llama")
    print(out.resolve())


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/tiny_llama.py OUT_DIR")
    main(Path(sys.argv[1]))
