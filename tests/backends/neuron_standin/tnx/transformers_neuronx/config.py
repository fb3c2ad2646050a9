"""Stand-in of transformers_neuronx.config (argument names and checks from transformers-neuronx 0.13)."""

KNOWN_FIELDS = ("collectives_layout", "attention_layout", "cache_layout", "fuse_qkv", "fuse_mlp", "quant",
                "kv_cache_quant", "continuous_batching", "padding_side", "on_device_embedding",
                "on_device_generation", "weight_tiling", "group_query_attention", "sequence_parallel_norm",
                "all_reduce_dtype", "cast_logits_dtype", "output_all_logits", "is_eagle_target", "is_eagle_draft")


class QuantizationConfig:
    def __init__(self, quant_dtype="s8", dequant_dtype="f16", quantize_method="vector_dynamic", quantize_attn=True,
                 no_quantize_list=()):
        if quant_dtype not in ("s8", "f8e4m3fn"):
            raise NotImplementedError(f"{quant_dtype} is not implemented. Available options are s8,f8e4m3fn")
        if quantize_method not in ("vector_dynamic", "direct_cast"):
            raise NotImplementedError(f"{quantize_method} is not implemented")
        self.quant_dtype, self.dequant_dtype, self.quantize_method = quant_dtype, dequant_dtype, quantize_method


class ContinuousBatchingConfig:
    def __init__(self, **kwargs):
        self.max_num_seqs = kwargs.pop("max_num_seqs") if kwargs.get("max_num_seqs") is not None else \
            kwargs.pop("batch_size_for_shared_caches")
        self.max_model_len = kwargs.pop("max_model_len", None)
        self.optimized_paged_attention = kwargs.pop("optimized_paged_attention", False)
        self.enable_chunked_prefill = kwargs.pop("enable_chunked_prefill", False)
        assert len(kwargs) == 0, f"unexpected key word arguments: {kwargs.keys()}"


class GenerationConfig:
    def __init__(self, *, max_length=None, do_sample=False, top_k=50, top_p=1.0, top_p_min_tokens=1,
                 global_top_k=None, eos_token_id=None, temperature=1.0, dynamic=False, deterministic=False,
                 per_batch_line=False):
        self.max_length, self.do_sample, self.top_k, self.top_p = max_length, do_sample, top_k, float(top_p)
        self.temperature, self.global_top_k, self.dynamic = float(temperature), global_top_k, dynamic
        self.deterministic, self.per_batch_line = deterministic, per_batch_line


class NeuronConfig:
    def __init__(self, **kwargs):
        unknown = set(kwargs) - set(KNOWN_FIELDS)
        if unknown:  # the real __init__ has explicit keyword arguments: unknown names raise TypeError
            raise TypeError(f"NeuronConfig got unexpected keyword arguments {sorted(unknown)}")
        self.__dict__.update(kwargs)
