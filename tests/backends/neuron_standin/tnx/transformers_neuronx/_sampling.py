"""Shared stand-in behaviour of the *ForSampling classes."""

import hashlib
import json
import os

from transformers_neuronx._standin import record


class StandinForSampling:
    @classmethod
    def from_pretrained(cls, pretrained_model_path, *model_args, **kwargs):
        from transformers import AutoConfig

        AutoConfig.from_pretrained(pretrained_model_path)  # the real one reads the HF config (and weights)
        model = cls()
        model.kwargs = kwargs
        record("from_pretrained", cls=cls.__name__, path=pretrained_model_path,
               kwargs={k: v for k, v in kwargs.items() if k != "neuron_config"},
               neuron_config=_plain(kwargs.get("neuron_config")))
        return model

    def _compile(self, how):
        record(how, platform_target=os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE"))
        # one kernel per context-length estimate and per n_positions bucket, named by a hash as TNx does
        kernels = [f"ctx{b}" for b in self.kwargs["context_length_estimate"]]
        kernels += [f"tkg{b}" for b in self.kwargs["n_positions"]]
        self.neff_bytes = {hashlib.sha256(k.encode()).hexdigest()[:20] + ".neff": k.encode() for k in kernels}

    def to_neuron(self):
        self._compile("to_neuron")

    def cpu_compile(self):
        self._compile("cpu_compile")

    def save(self, directory, sharded_weights=False):
        record("save", directory=directory)
        for name, data in self.neff_bytes.items():
            with open(os.path.join(directory, name), "wb") as fh:
                fh.write(data)


def _plain(obj):
    if hasattr(obj, "__dict__"):
        return {k: _plain(v) for k, v in obj.__dict__.items()}
    return json.loads(json.dumps(obj, default=str))
