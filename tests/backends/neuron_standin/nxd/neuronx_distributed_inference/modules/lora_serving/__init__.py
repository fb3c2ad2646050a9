"""Stand-in of neuronx_distributed_inference.modules.lora_serving.LoraServingConfig (argument names from NxDI 0.9)."""


class LoraServingConfig:
    def __init__(self, max_loras=1, max_lora_rank=16, max_cpu_loras=100, batch_size=1, target_modules=None,
                 lora_bias="none", lora_ckpt_paths=None, lora_ckpt_paths_cpu=None, lora_ckpt_json=None,
                 lora_memory_transpose=True, lora_shard_linear_layer=True, is_context_encoding=False,
                 dynamic_multi_lora=False, eviction_policy="lru", lfu_decay_period=128, base_model_quantized=False,
                 enable_base_model_only=False):
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.target_modules = target_modules
        self.lora_ckpt_paths = lora_ckpt_paths
