"""Stand-in of neuronx_distributed_inference.models.qwen3_moe.modeling_qwen3_moe (class names as in NxDI 0.9): its
config reads num_experts and uses MoENeuronConfig."""

from neuronx_distributed_inference.models.application_base import NeuronApplicationBase
from neuronx_distributed_inference.models.config import InferenceConfig, MoENeuronConfig


class Qwen3MoeInferenceConfig(InferenceConfig):
    def get_required_attributes(self):
        return ["num_experts", "num_experts_per_tok", "moe_intermediate_size", "head_dim"]

    @classmethod
    def get_neuron_config_cls(cls):
        return MoENeuronConfig


class NeuronQwen3MoeModel:
    pass


class NeuronQwen3MoeForCausalLM(NeuronApplicationBase):
    _model_cls = NeuronQwen3MoeModel

    @classmethod
    def get_config_cls(cls):
        return Qwen3MoeInferenceConfig
