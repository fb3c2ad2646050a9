"""Tiny checkpoints whose greedy output is known in advance, to test what a server makes of a reasoning model's output
(``<think>...</think>``, harmony channels) on the real engine: a random tiny model writes noise.

A scripted model is a transformers ``LlamaForCausalLM`` (2 layers, hidden 64) whose attention and MLP outputs are
zero (``o_proj`` and ``down_proj`` weights), so the hidden state at a position is its token's embedding and the
logits depend on that token alone; the LM head is solved (least squares over the embeddings, normed as the model
norms them) so that each token of a script is followed by the next one. Greedy decoding from a prompt that ends with
the script's first token then writes the script: a bigram chain, so the script's tokens must be distinct.
transformers' own ``generate`` gives the same tokens (a test checks it).

``make_qwen3_demo`` writes the one docs/serve.md serves: with Qwen3's chat template, it answers a question with
``<think>Let me see</think>\n\n Paris is nice<|im_end|>``, and `` Paris is nice<|im_end|>`` when the prompt closes the
reasoning itself (``enable_thinking`` false); ``python -m tests.helpers.scripted_models DIR`` writes it.

Example::

    tok = qwen3_tokenizer()
    chain = script(tok, ["\\n"], [["<think>"], "Let me see", ["</think>"], "\\n\\n", "Paris", ["<|im_end|>"]])
    make_scripted_checkpoint(tmp_path / "m", tok, chain)
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.tiny_models import CORPUS, tiny_config

TEMPLATES = Path(__file__).parent / "templates"
QWEN3_TEMPLATE = TEMPLATES / "qwen3.jinja"  # Qwen3's chat template (Qwen/Qwen3-8B tokenizer_config.json)
THINK_CORPUS = ["Let me see. Paris is nice.\n\nThe capital of France is Paris.\n\n"] * 20


def qwen3_tokenizer(vocab_size: int = 400, *, extra_tokens: tuple[str, ...] = ()):
    """A byte-level BPE tokenizer laid out as Qwen3's: ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>``
    (EOS) special; ``<think>``, ``</think>``, ``<tool_call>``, ``</tool_call>`` added but not special (so decoded
    text keeps them, as Qwen3's does); Qwen3's chat template. ``extra_tokens``: more added tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS + THINK_CORPUS, trainer=trainer)
    added = ("<think>", "</think>", "<tool_call>", "</tool_call>", *extra_tokens)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = QWEN3_TEMPLATE.read_text()
    return fast


def script(tokenizer, start: list[int], pieces: list[str | list[str]]) -> list[int]:
    """The token chain ``start`` + each piece: a text encoded, or a list of tokens given by their text. Refuses a
    chain with a repeated token (a bigram model cannot write it)."""
    ids = list(start)
    for piece in pieces:
        ids += (tokenizer.convert_tokens_to_ids(piece) if isinstance(piece, list)
                else tokenizer.encode(piece, add_special_tokens=False))
    if len(set(ids)) != len(ids):
        raise ValueError(f"the script repeats a token: {tokenizer.convert_ids_to_tokens(ids)}")
    return ids


def make_scripted_checkpoint(out: Path, tokenizer, chains: list[list[int]], *, vocab_size: int | None = None,
                             seed: int = 0) -> Path:
    """Write a scripted Llama (see the module) with ``tokenizer``'s files to ``out``: in each chain, every token is
    followed by the next. Chains may share tokens only where they agree on the successor."""
    import torch
    import transformers

    successors: dict[int, int] = {}
    for chain in chains:
        for token, following in zip(chain, chain[1:], strict=False):
            if successors.setdefault(token, following) != following:
                raise ValueError(f"token {token} is followed by {successors[token]} and by {following}")
    vocab = vocab_size or len(tokenizer)
    cfg = tiny_config("llama", vocab_size=vocab, tie=False)
    cfg.eos_token_id = cfg.bos_token_id = tokenizer.eos_token_id
    cfg.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:  # the layers add nothing: a position's state is its token's embedding
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        sources = sorted(successors)
        hidden = model.model.norm(model.model.embed_tokens.weight[sources]).double()  # [k, hidden]
        target = torch.zeros(len(sources), vocab, dtype=torch.float64)
        target[range(len(sources)), [successors[s] for s in sources]] = 20.0
        model.lm_head.weight.copy_((torch.linalg.pinv(hidden) @ target).T.float())  # hidden @ W.T == target
    out = Path(out)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": cfg.eos_token_id,
                                                            "pad_token_id": cfg.pad_token_id}))
    return out


QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def make_qwen3_demo(out: Path) -> tuple[Path, list[int], list[int], list[int]]:
    """The scripted Qwen3-layout model of docs/serve.md in ``out``: (its directory, the prompt ids of QUESTION with
    thinking on, with thinking off, the tokens it writes after the first)."""
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    out = Path(out)
    tok = qwen3_tokenizer()
    tok.save_pretrained(out)
    template = ArtifactTokenizer.from_dir(out)
    thinking = template.encode_chat(QUESTION)
    plain = template.encode_chat(QUESTION, template_kwargs={"enable_thinking": False})
    think = script(tok, [thinking[-1]], [["<think>"], "Let me see", ["</think>"]])
    answer = script(tok, [plain[-1]], [" Paris is nice", ["<|im_end|>"]])
    make_scripted_checkpoint(out, tok, [[*think, plain[-1]], answer])
    return out, thinking, plain, [*think[1:], *answer]


if __name__ == "__main__":
    import sys

    print(make_qwen3_demo(Path(sys.argv[1]))[0])
