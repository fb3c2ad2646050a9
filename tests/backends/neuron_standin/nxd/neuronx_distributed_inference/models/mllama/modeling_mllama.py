"""Stand-in of neuronx_distributed_inference.models.mllama.modeling_mllama (class names as in NxDI 0.9)."""

from neuronx_distributed_inference.models.application_base import NeuronApplicationBase
from neuronx_distributed_inference.models.config import InferenceConfig, MultimodalVisionNeuronConfig


class MllamaInferenceConfig(InferenceConfig):
    @classmethod
    def get_neuron_config_cls(cls):
        return MultimodalVisionNeuronConfig


class NeuronMllamaModel:
    pass


class NeuronMllamaForCausalLM(NeuronApplicationBase):
    _model_cls = NeuronMllamaModel

    @classmethod
    def get_config_cls(cls):
        return MllamaInferenceConfig

    @classmethod
    def get_neuron_config_cls(cls):
        return MultimodalVisionNeuronConfig
