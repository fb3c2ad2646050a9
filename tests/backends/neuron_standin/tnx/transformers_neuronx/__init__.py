"""TEST STAND-IN for transformers-neuronx 0.13 (the Neuron SDK cannot run here): same module paths and class
names; records calls in ``_standin.CALLS`` and writes what ``save()`` writes (one ``<hlo hash>.neff`` per kernel)."""

__version__ = "0.13.1216"
