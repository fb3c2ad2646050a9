"""Test stand-in for NKI (the plugin's cache key reads nki._version.__version__)."""
from nki import _version  # noqa: F401
