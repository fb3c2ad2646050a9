"""Test stand-in: vLLM (only its OpenAI server entry point, entrypoints/openai/api_server.py)."""
__version__ = "0.21.0"
