"""Test stand-in for torch-neuronx (only its presence and version are read)."""
__version__ = "2.6.0.2.8.0"
