"""Stand-in of neuronx_distributed_inference.utils.hf_adapter.load_pretrained_config: reads the HF config with
transformers' AutoConfig and copies its fields onto the InferenceConfig, as the real hook does. NxDI 0.9 pins
transformers 4.57, whose configs keep config.json's own names; the transformers here (5.x) renames some (Qwen3-MoE's
num_experts -> num_local_experts), so config.json's keys are laid over it, as 4.57 would have them."""

from neuronx_distributed_inference._standin import record


def load_pretrained_config(model_path_or_name=None, hf_config=None):
    def load_config(self):
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path_or_name) if hf_config is None else hf_config
        data = config.to_dict()
        if hf_config is None:
            import json
            import os

            with open(os.path.join(model_path_or_name, "config.json")) as fh:
                data.update(json.load(fh))
        hf_dtype = data.pop("dtype", None) or data.pop("torch_dtype", None)
        data.pop("torch_dtype", None)
        if hf_dtype is not None and self.neuron_config is not None and not self.neuron_config.overrides_torch_dtype:
            self.neuron_config.torch_dtype = str(hf_dtype)
        self.__dict__.update(data)
        record("load_pretrained_config", path=str(model_path_or_name), architectures=data.get("architectures"))

    return load_config
