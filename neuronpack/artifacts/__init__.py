"""Content-addressed compiled artifacts: the key, the manifest, atomic publish, locks, verify, ls, gc, and
NEURON_COMPILED_ARTIFACTS resolution."""
