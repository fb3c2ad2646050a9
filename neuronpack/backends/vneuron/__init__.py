"""The SDK 2.31+ vLLM Neuron plugin (framework ``vneuron``): vllm-neuron 0.21 (vLLM 0.21, SDK 2.31) and 0.24 (vLLM
0.24, SDK 2.32), a torch.compile rewrite that implements the models itself, without NxD Inference, and keeps every
compiled graph in its own compile cache (``$VLLM_CACHE_ROOT/neuron/compile_cache/<32 hex>/``).

neuronpack builds that cache ahead of time and ships it as an artifact:

- config.py: the recipe -> vLLM's flags, the plugin's ``--additional-config {"neuron_config": ...}`` and the
  environment, one ``PluginConfig`` for the CPU compile and the pod alike (torch-free);
- run.py: the plugin's own CPU compile (``VLLM_NEURON_CPU_COMPILE=1``) in a child process, stopped once it serves;
- cache.py: upstream's rule for a complete cache entry, and packaging only what a lookup reads;
- backend.py: the ``Backend`` (versions, target, compile_config, build, validate_artifact);
- launch.py: ``neuronpack serve``: the pod's environment and command, every graph a local hit, a miss an error;
- pod.py: what runs on the pod around vLLM: the local cache root made anew from the artifact, the installed plugin
  asked (probe.py, in vLLM's Python) where its root is and which guards it reads, the root watched for a compile.
"""
