"""NxD Inference 0.9.0's two Gemma 3 defects fixed in memory, standing in for an NxDI release that fixes them (the
acceptance half of the Gemma 3 judge, neuronpack/backends/nxd/defects.py). Loaded by shim_site/sitecustomize.py when
``NEURONPACK_UPSTREAM_FIX=gemma3``; nothing else ever loads it.

(1) NeuronGemma3TextModel gets its ``sliding_window`` (after its KV cache manager is built, which sizes every layer's
cache by it), and ``has_mixed_attn``, so context encoding makes the windowed mask for the sliding layers
(models/model_base.py:794) and hands both masks to the layers; (2) each decoder layer computes its own rotary cos /
sin (its attention's rope: local or global) instead of taking layer 0's (models/model_base.py:1394).
"""

from neuronx_distributed_inference.models.gemma3 import modeling_gemma3

_model_init = modeling_gemma3.NeuronGemma3TextModel.__init__
_layer_forward = modeling_gemma3.NeuronGemma3DecoderLayer.forward


def _init(self, config, *args, **kwargs):
    _model_init(self, config, *args, **kwargs)
    self.sliding_window = config.sliding_window
    self.has_mixed_attn = True


def _forward(self, *args, **kwargs):
    kwargs["cos_cache"] = kwargs["sin_cache"] = None
    return _layer_forward(self, *args, **kwargs)


modeling_gemma3.NeuronGemma3TextModel.__init__ = _init
modeling_gemma3.NeuronGemma3DecoderLayer.forward = _forward
