"""Test stand-in for neuronx-cc (the plugin's cache key reads its version)."""
__version__ = "2.31.0"
