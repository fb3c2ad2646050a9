"""Stand-in of transformers_neuronx.mistral.model.MistralForSampling."""

from transformers_neuronx._sampling import StandinForSampling


class MistralForSampling(StandinForSampling):
    pass
