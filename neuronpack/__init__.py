"""neuronpack: ahead-of-time compile and package LLMs for AWS Neuron (and any CPU through PyTorch)."""

__version__ = "0.1.0"
