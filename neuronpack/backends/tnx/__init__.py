"""transformers-neuronx (the fallback stack): the backend (backend.py). Served by vLLM V0 (backends/vllm/)."""
