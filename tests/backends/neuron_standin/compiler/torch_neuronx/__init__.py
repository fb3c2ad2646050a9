"""Test stand-in for torch-neuronx (only its presence and version are read)."""
__version__ = "2.9.0.2.13.0"
