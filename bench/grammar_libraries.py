"""llguidance vs xgrammar on our tokenizers: the measurements behind the choice of grammar library
(docs/architecture.md, "Structured outputs").

For the tiny test tokenizer (tests/helpers/tiny_models.py, 384 tokens) and SmolLM2-135M-Instruct's (49,152): the
tokenizer set-up (token trie, once per server), the compile of a typical schema (8 fields, a nested object, an enum, a
pattern), and the per-token mask along a valid instance of it (compact JSON), one thread. A table on stdout.
xgrammar is not a dependency: ``pip install --no-deps xgrammar apache-tvm-ffi`` first (its declared triton is not
needed on CPU); without it, its rows are left out with a note.

    .venv/bin/python -m bench.grammar_libraries [--model DIR] [--workdir DIR]
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

from bench._common import bench_parser, model_checkpoint

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}, "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["street", "city", "zip"], "additionalProperties": False},
        "role": {"enum": ["admin", "user", "guest"]}, "score": {"type": "number"}, "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "tags", "address", "role", "score", "active"],
    "additionalProperties": False,
}
INSTANCE = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.com", "tags": ["math", "engines", "poetry"],
            "address": {"street": "12 St James Square", "city": "London", "zip": "12345"}, "role": "admin",
            "score": 9.5, "active": True}


def llguidance_run(tokenizer_dir: Path) -> tuple[float, float, list[float]]:
    import llguidance
    import torch
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    started = time.perf_counter()
    tok = llguidance.LLTokenizer(raw.to_str())
    setup = time.perf_counter() - started
    started = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA), defaults={"whitespace_flexible": False})
    matcher = llguidance.LLMatcher(tok, grammar)
    compile_s = time.perf_counter() - started
    mask = torch.empty(1, (raw.get_vocab_size(True) + 31) // 32, dtype=torch.int32)
    times = []
    for token in raw.encode(json.dumps(INSTANCE, separators=(",", ":")), add_special_tokens=False).ids:
        started = time.perf_counter()
        matcher.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)
        times.append(time.perf_counter() - started)
        if not matcher.consume_token(token):
            raise RuntimeError(matcher.get_error())
    return setup, compile_s, times


def xgrammar_run(tokenizer_dir: Path) -> tuple[float, float, list[float]]:
    import xgrammar
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    vocab = raw.get_vocab_size(True)
    started = time.perf_counter()
    info = xgrammar.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=raw), vocab_size=vocab)
    compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    setup = time.perf_counter() - started
    started = time.perf_counter()
    matcher = xgrammar.GrammarMatcher(compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False,
                                                                   separators=(",", ":")))
    compile_s = time.perf_counter() - started
    mask = xgrammar.allocate_token_bitmask(1, vocab)
    times = []
    for token in raw.encode(json.dumps(INSTANCE, separators=(",", ":")), add_special_tokens=False).ids:
        started = time.perf_counter()
        matcher.fill_next_token_bitmask(mask)
        times.append(time.perf_counter() - started)
        if not matcher.accept_token(token):
            raise RuntimeError(f"xgrammar refused token {token}")
    return setup, compile_s, times


def main() -> None:
    parser = bench_parser("grammar_libraries", __doc__, model="smollm2")
    args = parser.parse_args()
    import torch

    from tests.helpers.tiny_models import make_tokenizer

    torch.set_num_threads(1)
    tiny = args.workdir / "tiny-tokenizer"
    make_tokenizer().save_pretrained(tiny)
    libraries = [("llguidance", llguidance_run), ("xgrammar", xgrammar_run)]
    if importlib.util.find_spec("xgrammar") is None:
        print("xgrammar is not installed: its rows are left out (pip install --no-deps xgrammar apache-tvm-ffi)",
              file=sys.stderr)
        libraries = libraries[:1]
    print("| tokenizer | library | setup ms | compile ms | mask ms mean | mask ms max | tokens |")
    print("|---|---|---|---|---|---|---|")
    for label, path in (("tiny (384)", tiny), ("SmolLM2 (49152)", model_checkpoint(args))):
        for name, run in libraries:
            setup, compile_s, times = run(path)
            print(f"| {label} | {name} | {setup * 1e3:.1f} | {compile_s * 1e3:.1f} | "
                  f"{statistics.mean(times) * 1e3:.3f} | {max(times) * 1e3:.3f} | {len(times)} |")


if __name__ == "__main__":
    main()
