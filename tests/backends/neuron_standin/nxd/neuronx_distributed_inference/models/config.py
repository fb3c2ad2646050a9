"""Stand-in of neuronx_distributed_inference.models.config: the NeuronConfig fields neuronpack may set (names and
defaults from NxDI 0.9's source); kwargs NxDI does not know are kept in ``unexpected`` (the real class logs a
warning and ignores them). Upstream behaviours reproduced: enable_eagle_speculation forces enable_fused_speculation
in __init__; ``is_eagle3`` exists only from NxDI 0.7 (older versions drop it as unexpected); InferenceConfig.load
drops fused_spec_config; ``trace_tokengen_model`` is an attribute vLLM sets, not a kwarg."""

import importlib.metadata
import json
import os

from neuronx_distributed_inference._standin import record
from neuronx_distributed_inference.modules.lora_serving import LoraServingConfig

CONFIG_FILE = "neuron_config.json"

KNOWN_FIELDS = {
    "batch_size": 1, "padding_side": "right", "seq_len": 128, "torch_dtype": "bfloat16", "max_context_length": None,
    "max_length": None, "sequence_parallel_enabled": False, "ctx_batch_size": None, "tkg_batch_size": None,
    "is_continuous_batching": False, "on_device_sampling_config": None, "enable_bucketing": False,
    "context_encoding_buckets": None, "token_generation_buckets": None, "quantized": False,
    "quantized_checkpoints_path": None, "quantization_type": "per_tensor_symmetric", "quantization_dtype": "int8",
    "modules_to_not_convert": None, "draft_model_modules_to_not_convert": None, "kv_cache_quant": False,
    "speculation_length": 0, "enable_fused_speculation": False, "enable_eagle_speculation": False, "is_eagle3": False,
    "is_eagle_draft": False, "enable_eagle_draft_input_norm": False, "lora_config": None, "tp_degree": 1,
    "save_sharded_checkpoint": False, "world_size": None, "start_rank_id": 0, "local_ranks_size": None,
    "fused_qkv": False, "logical_nc_config": 1, "cast_type": "config",
}
SINCE = {"is_eagle3": (0, 7)}  # field -> first NxDI release that knows it


def _installed_version():
    text = importlib.metadata.version("neuronx-distributed-inference")
    return tuple(int(p) for p in text.split(".")[:2])


class NeuronConfig:
    def __init__(self, **kwargs) -> None:
        self.overrides_torch_dtype = "torch_dtype" in kwargs
        version = _installed_version()
        for name, default in KNOWN_FIELDS.items():
            if name in SINCE and version < SINCE[name]:
                continue  # left in kwargs: reported as unexpected, as the older release does
            setattr(self, name, kwargs.pop(name, default))
        if self.max_context_length is None:
            self.max_context_length = self.seq_len
        if self.max_length is None:
            self.max_length = self.seq_len
        for name in ("ctx_batch_size", "tkg_batch_size"):
            if getattr(self, name) is None:
                setattr(self, name, self.batch_size)
        if type(self.on_device_sampling_config) is dict:
            self.on_device_sampling_config = OnDeviceSamplingConfig(**self.on_device_sampling_config)
        if type(self.lora_config) is dict:
            self.lora_config = LoraServingConfig(**self.lora_config)
        if self.quantized:
            assert self.quantized_checkpoints_path is not None, "quantized_checkpoints_path is required"
        if self.enable_eagle_speculation:
            self.enable_fused_speculation = True
        if self.world_size is None:
            self.world_size = self.tp_degree
        if self.local_ranks_size is None:
            self.local_ranks_size = self.world_size
        self.unexpected = dict(kwargs)
        record("NeuronConfig", kwargs=to_dict(self))


class OnDeviceSamplingConfig:
    def __init__(self, **kwargs):
        self.do_sample = kwargs.pop("do_sample", False)
        self.top_k = kwargs.pop("top_k", 1)
        self.top_p = kwargs.pop("top_p", 1.0)
        self.temperature = kwargs.pop("temperature", 1.0)
        self.dynamic = kwargs.pop("dynamic", False)
        self.deterministic = kwargs.pop("deterministic", False)
        self.global_topk = kwargs.pop("global_topk", 256)
        self.unexpected = dict(kwargs)


class FusedSpecNeuronConfig:
    def __init__(self, worker_cls, draft_config=None, draft_model_path=None, draft_model_cls=None) -> None:
        self.worker_cls = worker_cls
        self.draft_model_cls = draft_model_cls
        self.draft_config = draft_config
        self.draft_model_path = draft_model_path
        record("FusedSpecNeuronConfig", worker_cls=worker_cls.__name__, draft_model_path=draft_model_path)


class InferenceConfig:
    def __init__(self, neuron_config, fused_spec_config=None, load_config=None, metadata=None, **kwargs):
        self.neuron_config = neuron_config
        self.fused_spec_config = fused_spec_config
        if load_config is not None:
            load_config(self)
        self.metadata = metadata
        for key, value in kwargs.items():
            setattr(self, key, value)
        missing = [x for x in self.get_required_attributes() if not hasattr(self, x)]
        assert not missing, f"Config must define {missing}"  # upstream's validate_config

    def get_required_attributes(self):
        return []

    @classmethod
    def get_neuron_config_cls(cls):
        return NeuronConfig

    def save(self, model_path):
        os.makedirs(model_path, exist_ok=True)
        with open(os.path.join(model_path, CONFIG_FILE), "w") as fh:
            fh.write(json.dumps(to_dict(self), indent=2, sort_keys=True, default=str) + "\n")

    @classmethod
    def load(cls, model_path):
        with open(os.path.join(model_path, CONFIG_FILE)) as fh:
            data = json.load(fh)
        data["neuron_config"] = cls.get_neuron_config_cls()(**data["neuron_config"])
        data.pop("fused_spec_config", None)
        return cls(**data)


def to_dict(obj):
    if type(obj) is dict:
        return {k: to_dict(v) for k, v in obj.items()}
    if type(obj) is list:
        return [to_dict(v) for v in obj]
    if isinstance(obj, type):
        return {"__module__": obj.__module__, "__name__": obj.__name__}
    if hasattr(obj, "__dict__"):
        return {k: to_dict(v) for k, v in obj.__dict__.items()}
    return obj


class MoENeuronConfig(NeuronConfig):
    """The expert sharding fields (NxDI 0.9 config.py: moe_tp_degree / moe_ep_degree, default 1)."""

    def __init__(self, **kwargs) -> None:
        self.moe_tp_degree = kwargs.pop("moe_tp_degree", 1)
        self.moe_ep_degree = kwargs.pop("moe_ep_degree", 1)
        super().__init__(**kwargs)


class MultimodalVisionNeuronConfig(NeuronConfig):
    def __init__(self, **kwargs) -> None:
        self.skip_vision = kwargs.pop("skip_vision", False)
        super().__init__(**kwargs)
