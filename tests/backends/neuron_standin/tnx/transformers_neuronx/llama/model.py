"""Stand-in of transformers_neuronx.llama.model.LlamaForSampling."""

from transformers_neuronx._sampling import StandinForSampling


class LlamaForSampling(StandinForSampling):
    pass
