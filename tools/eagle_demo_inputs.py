"""The inputs of docs/convert-eagle.md's worked example, for a reader to run it from a checkout:

    python tools/eagle_demo_inputs.py demo && cd demo

writes llama-target/ (a tiny random bf16 Llama in 7 shards), eagle1-draft/ (an fp16 EAGLE-1 draft as
pytorch_model.bin), eagle3-draft/ and eagle3-small-vocab/ (EAGLE-3 drafts, the second with a 128-token vocabulary)
with the test suite's own fixtures (tests/helpers/tiny_models.py, tests/convert/eagle_fixtures.py). Random weights: the
example shows conversion, not text.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.convert.eagle_fixtures import make_eagle1_draft, make_eagle3_draft  # noqa: E402
from tests.helpers.tiny_models import make_tiny_checkpoint  # noqa: E402


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    target = make_tiny_checkpoint(out / "llama-target", arch="llama", seed=7, dtype="bfloat16", max_shard_size="40KB")
    vocab = 384
    make_eagle1_draft(out / "eagle1-draft", vocab=vocab)
    make_eagle3_draft(out / "eagle3-draft", vocab=vocab)
    make_eagle3_draft(out / "eagle3-small-vocab", vocab=vocab, draft_vocab=128)
    print(out.resolve(), f"(target: {sum(1 for _ in target.glob('*.safetensors'))} shards)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/eagle_demo_inputs.py OUT_DIR")
    main(Path(sys.argv[1]))
