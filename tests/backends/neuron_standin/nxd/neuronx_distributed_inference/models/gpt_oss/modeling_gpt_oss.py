"""Stand-in of neuronx_distributed_inference.models.gpt_oss.modeling_gpt_oss (class names as in NxDI 0.9): its
config requires initial_context_length (get_required_attributes) and its NeuronConfig is a MoENeuronConfig."""

from neuronx_distributed_inference.models.application_base import NeuronApplicationBase
from neuronx_distributed_inference.models.config import InferenceConfig, MoENeuronConfig


class GptOssNeuronConfig(MoENeuronConfig):
    def __init__(self, **kwargs):
        self.sliding_window_attention_dp_degree = kwargs.pop("sliding_window_attention_dp_degree", 1)
        super().__init__(**kwargs)


class GptOssInferenceConfig(InferenceConfig):
    def get_required_attributes(self):
        return ["num_local_experts", "sliding_window", "initial_context_length", "head_dim"]

    @classmethod
    def get_neuron_config_cls(cls):
        return GptOssNeuronConfig


class NeuronGptOssModel:
    pass


class NeuronGptOssForCausalLM(NeuronApplicationBase):
    _model_cls = NeuronGptOssModel

    @classmethod
    def get_config_cls(cls):
        return GptOssInferenceConfig
