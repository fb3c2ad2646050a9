"""Placeholder until this command lands (being written now)."""
from neuronpack.errors import NeuronpackError


def convert_eagle_command() -> None:
    """(in progress)"""
    raise NeuronpackError("this command is not built yet")
