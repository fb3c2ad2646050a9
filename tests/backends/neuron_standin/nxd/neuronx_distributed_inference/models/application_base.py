"""Stand-in of neuronx_distributed_inference.models.application_base.NeuronApplicationBase.

``compile(path)`` does what the real one does (NxDI 0.9 models/application_base.py): config.save (neuron_config.json),
the trace (recorded as "compile": the one step that runs neuronx-cc; model.pt here is a marker, the real one is the
traced TorchScript with the NEFFs inside, traced with initialize_model_weights=False), then ``shard_weights(path)``,
the public step of its own: with save_sharded_checkpoint, one ``weights/tp{rank}_sharded_checkpoint.safetensors`` per
rank in start_rank_id .. start_rank_id + local_ranks_size - 1 (ModelBuilder.shard_checkpoint), each holding that
rank's dim-0 slice of every checkpoint tensor; without it, nothing (weights are sharded at load).
"""

import os

from neuronx_distributed_inference._standin import record

COMPILED_MODEL_FILE_NAME = "model.pt"


def normalize_path(path):
    return os.path.join(os.path.normpath(path), "")


class NeuronApplicationBase:
    _model_cls = None

    def __init__(self, model_path, config=None, neuron_config=None):
        model_path = normalize_path(model_path)
        loaded = config is None
        if config is None:
            config = self.get_config_cls().load(model_path)
        self.config = config
        self.neuron_config = config.neuron_config
        self.model_path = model_path
        record("model_init", cls=type(self).__name__, model_path=model_path, loaded=loaded)

    @classmethod
    def get_config_cls(cls):
        raise NotImplementedError

    @classmethod
    def get_neuron_config_cls(cls):
        return cls.get_config_cls().get_neuron_config_cls()

    def compile(self, compiled_model_path, debug=False, pre_shard_weights_hook=None, dry_run=False):
        compiled_model_path = normalize_path(compiled_model_path)
        record("compile", path=compiled_model_path, cls=type(self).__name__,
               platform_target=os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE"),
               fused_spec=self.config.fused_spec_config is not None)
        self.config.save(compiled_model_path)
        with open(compiled_model_path + COMPILED_MODEL_FILE_NAME, "wb") as fh:
            fh.write(b"neuronpack test stand-in: NxDI would write the traced model here\n")
        self.shard_weights(compiled_model_path, debug)

    def shard_weights(self, compiled_model_path, debug=False, pre_shard_weights_hook=None):
        compiled_model_path = normalize_path(compiled_model_path)
        record("shard_weights", path=compiled_model_path, model_path=self.model_path)
        if pre_shard_weights_hook:
            pre_shard_weights_hook(self)
        if self.neuron_config.save_sharded_checkpoint:
            self._shard_checkpoint(os.path.join(compiled_model_path, "weights"))

    def _shard_checkpoint(self, out_dir):
        from safetensors import safe_open
        from safetensors.torch import save_file

        os.makedirs(out_dir, exist_ok=True)
        files = sorted(f for f in os.listdir(self.model_path) if f.endswith(".safetensors"))
        tp, start = self.neuron_config.tp_degree, self.neuron_config.start_rank_id
        for rank in range(start, start + self.neuron_config.local_ranks_size):
            shard = {}
            for name in files:
                with safe_open(os.path.join(self.model_path, name), framework="pt") as fh:
                    for key in fh.keys():
                        tensor = fh.get_tensor(key)
                        rows = tensor.shape[0] if tensor.dim() else 1
                        if tensor.dim() and rows % tp == 0:
                            tensor = tensor[rank * rows // tp:(rank + 1) * rows // tp]
                        shard[key] = tensor.contiguous()
            save_file(shard, os.path.join(out_dir, f"tp{rank}_sharded_checkpoint.safetensors"))
