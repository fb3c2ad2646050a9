"""Stand-in of neuronx_distributed_inference.models.qwen3.modeling_qwen3 (class names as in NxDI 0.9)."""

from neuronx_distributed_inference.models.application_base import NeuronApplicationBase
from neuronx_distributed_inference.models.config import InferenceConfig, NeuronConfig


class Qwen3NeuronConfig(NeuronConfig):
    pass


class Qwen3InferenceConfig(InferenceConfig):
    @classmethod
    def get_neuron_config_cls(cls):
        return Qwen3NeuronConfig


class NeuronQwen3Model:
    pass


class NeuronQwen3ForCausalLM(NeuronApplicationBase):
    _model_cls = NeuronQwen3Model

    @classmethod
    def get_config_cls(cls):
        return Qwen3InferenceConfig
