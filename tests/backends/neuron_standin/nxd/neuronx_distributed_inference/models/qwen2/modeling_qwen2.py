"""Stand-in of neuronx_distributed_inference.models.qwen2.modeling_qwen2 (class names as in NxDI 0.9)."""

from neuronx_distributed_inference.models.application_base import NeuronApplicationBase
from neuronx_distributed_inference.models.config import InferenceConfig, NeuronConfig


class Qwen2NeuronConfig(NeuronConfig):
    pass


class Qwen2InferenceConfig(InferenceConfig):
    @classmethod
    def get_neuron_config_cls(cls):
        return Qwen2NeuronConfig


class NeuronQwen2Model:
    pass


class NeuronQwen2ForCausalLM(NeuronApplicationBase):
    _model_cls = NeuronQwen2Model

    @classmethod
    def get_config_cls(cls):
        return Qwen2InferenceConfig
