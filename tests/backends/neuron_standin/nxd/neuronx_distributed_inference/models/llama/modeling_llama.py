"""Stand-in of neuronx_distributed_inference.models.llama.modeling_llama (class names as in NxDI 0.9)."""

from neuronx_distributed_inference.models.application_base import NeuronApplicationBase
from neuronx_distributed_inference.models.config import InferenceConfig, NeuronConfig


class LlamaInferenceConfig(InferenceConfig):
    @classmethod
    def get_neuron_config_cls(cls):
        return NeuronConfig


class NeuronLlamaModel:
    pass


class NeuronLlamaForCausalLM(NeuronApplicationBase):
    _model_cls = NeuronLlamaModel

    @classmethod
    def get_config_cls(cls):
        return LlamaInferenceConfig
