"""Placeholder until this command lands (being written now)."""
from neuronpack.errors import NeuronpackError


def inspect_command() -> None:
    """(in progress)"""
    raise NeuronpackError("this command is not built yet")


def verify_command() -> None:
    """(in progress)"""
    raise NeuronpackError("this command is not built yet")


def ls_command() -> None:
    """(in progress)"""
    raise NeuronpackError("this command is not built yet")


def gc_command() -> None:
    """(in progress)"""
    raise NeuronpackError("this command is not built yet")
