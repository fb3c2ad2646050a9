"""The thin runtime for torch artifacts, in three wings that import one way (pyproject's import-linter contract):

- ``openai/``: the HTTP face (an OpenAI-compatible server, the request fields it parses, streams, limits);
- ``engine/``: continuous batching over the compiled KV rows (scheduler, runner, sampling, stop rules, speculation);
- ``structured/``: the grammar library the engine masks logits with;

and the glue at this level: ``launch.py`` (`neuronpack serve` as a library: a torch artifact's engine + app built
from options, or the vLLM launch of a Neuron one), ``loader.py`` (an artifact into an Engine), ``tokenizer.py``,
``adapters.py`` and ``limits.py``.

Importing this package imports nothing heavy; torch, FastAPI and transformers are imported by the modules that need
them.

Example::

    from neuronpack.runtime.loader import load_engine
    from neuronpack.runtime.engine import GenerationRequest

    loaded = load_engine(artifact_dir)
    tok = loaded.engine.tokenizer
    result = loaded.engine.generate(GenerationRequest(prompt_ids=tuple(tok.encode("Hello")), max_tokens=16))
"""
