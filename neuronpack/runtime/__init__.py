"""The thin runtime for torch artifacts: a continuous-batching engine over the compiled batch slots, per-request
sampling and stop rules, the artifact's tokenizer and chat template, and an OpenAI-compatible HTTP server.

Importing this package imports nothing heavy; torch, FastAPI and transformers are imported by the modules that need
them.

Example::

    from neuronpack.runtime.loader import load_engine
    from neuronpack.runtime.engine import GenerationRequest

    loaded = load_engine(artifact_dir)
    tok = loaded.engine.tokenizer
    result = loaded.engine.generate(GenerationRequest(prompt_ids=tuple(tok.encode("Hello")), max_tokens=16))
"""
