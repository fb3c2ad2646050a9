"""Stand-in of neuronx_distributed_inference.models.llama4.modeling_llama4 (class names as in NxDI 0.9): the
image-to-text application. Its config takes a text and a vision NeuronConfig and refuses fused speculation
(modeling_llama4.py:102); compile() writes neuron_config.json, text_model/model.pt and vision_model/model.pt
(image_to_text_model_base.py) and shards the text and the vision weights into weights/ with their own builders."""

import os

from neuronx_distributed_inference._standin import record
from neuronx_distributed_inference.models.application_base import (
    COMPILED_MODEL_FILE_NAME,
    NeuronApplicationBase,
    normalize_path,
)
from neuronx_distributed_inference.models.config import InferenceConfig, MoENeuronConfig


class Llama4NeuronConfig(MoENeuronConfig):
    pass


class Llama4InferenceConfig(InferenceConfig):
    def __init__(self, text_neuron_config, vision_neuron_config, fused_spec_config=None, load_config=None,
                 metadata=None, **kwargs):
        super().__init__(text_neuron_config, fused_spec_config, load_config, metadata, **kwargs)
        self.vision_neuron_config = vision_neuron_config
        if text_neuron_config.enable_fused_speculation:
            raise ValueError("Llama4 does not yet support fused speculation.")

    def get_required_attributes(self):
        return ["text_config", "vision_config"]

    @classmethod
    def get_neuron_config_cls(cls):
        return Llama4NeuronConfig


class NeuronLlama4ForCausalLM(NeuronApplicationBase):
    @classmethod
    def get_config_cls(cls):
        return Llama4InferenceConfig

    def compile(self, compiled_model_path, debug=False, pre_shard_weights_hook=None, dry_run=False):
        path = normalize_path(compiled_model_path)
        record("compile", path=path, cls=type(self).__name__,
               platform_target=os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE"), fused_spec=False)
        self.config.save(path)
        for sub in ("text_model", "vision_model"):
            os.makedirs(path + sub, exist_ok=True)
            with open(os.path.join(path, sub, COMPILED_MODEL_FILE_NAME), "wb") as fh:
                fh.write(b"neuronpack test stand-in: NxDI would write the traced model here\n")
        self.shard_text_weights(path)
        self.shard_vision_weights(path)

    def shard_text_weights(self, compiled_model_path, debug=False, pre_shard_weights_hook=None):
        record("shard_text_weights", path=normalize_path(compiled_model_path), model_path=self.model_path)
        if self.neuron_config.save_sharded_checkpoint:
            self._shard_checkpoint(os.path.join(normalize_path(compiled_model_path), "weights"))

    def shard_vision_weights(self, compiled_model_path, debug=False, pre_shard_weights_hook=None):
        record("shard_vision_weights", path=normalize_path(compiled_model_path), model_path=self.model_path)
