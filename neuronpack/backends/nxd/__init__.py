"""NxD Inference (SDK 2.2x classic stack): the backend (backend.py) and the recipe -> NeuronConfig mapping
(config.py). Served by vLLM V0 or the classic vllm-neuron plugin (backends/vllm/)."""
