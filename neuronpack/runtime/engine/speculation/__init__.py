"""Speculative decoding for the portable runtime: a proposer drafts up to k tokens per sequence, the target verifies
them all in one token-generation call, and acceptance keeps the longest prefix the target agrees with plus one token
of its own, so a step emits 1..k+1 tokens per sequence.

- ``proposer.py``: the ``Proposer`` interface (what an EAGLE draft plugs into) and prompt lookup (vLLM's ``ngram``).
- ``acceptance.py``: greedy acceptance and rejection sampling (the output distribution is the target's).
- ``stats.py``: per-request and per-step counts (vLLM's spec_decode metrics).
- ``step.py``: one draft-then-verify step over the running sequences (what the runner, runtime/engine/runner.py, calls).

Importing this package does not import torch.
"""
