"""Stand-in of neuronx_distributed_inference.modules.lora_serving.LoraServingConfig (argument names from NxDI 0.9).

Like the real one (lora_serving/config.py ``_check_valid_path``), every adapter path is checked when the config is
built, which happens again whenever neuron_config.json is loaded: a missing path raises FileNotFoundError (vLLM then
recompiles into NEURON_COMPILED_ARTIFACTS). Relative paths resolve against the working directory.
"""

import os


class LoraServingConfig:
    def __init__(self, max_loras=1, max_lora_rank=16, max_cpu_loras=100, batch_size=1, target_modules=None,
                 lora_bias="none", lora_ckpt_paths=None, lora_ckpt_paths_cpu=None, lora_ckpt_json=None,
                 lora_memory_transpose=True, lora_shard_linear_layer=True, is_context_encoding=False,
                 dynamic_multi_lora=False, eviction_policy="lru", lfu_decay_period=128, base_model_quantized=False,
                 enable_base_model_only=False):
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.target_modules = target_modules
        self.lora_ckpt_json = lora_ckpt_json
        self.lora_ckpt_paths = self._paths(lora_ckpt_paths)

    def _paths(self, paths):
        if paths is None:
            return {}
        if not isinstance(paths, dict):
            paths = dict(item.split(":", 1) for item in paths)
        for adapter_id, path in paths.items():
            if not os.path.exists(os.path.expanduser(path)):
                raise FileNotFoundError(f"LoRA adapter path {path} for adapter ID {adapter_id} is not found. "
                                        "Please check lora_ckpt_path and try again.")
        return dict(paths)
