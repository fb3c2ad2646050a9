"""Test stand-in for torch-neuronx (the plugin's cache key reads its version)."""
__version__ = "2.9.0.2.15.0"
