"""Test stand-in for the Neuron compiler package (only its presence and version are read)."""
__version__ = "2.24.5133.0"
