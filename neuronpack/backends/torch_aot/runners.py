"""The compiled graphs of a portable artifact as plain callables: ``run(weights, *args) -> tuple`` (weights: a dict
in the graph's input order, e.g. ``graphs.layer_weights``; args: the graph's other inputs). AOTInductor graphs run
through the C++ package loader, export-only programs through their ``module()``.

Example::

    runners = load_runners(Path("artifact/graphs.pt2"), config, task)     # config: the ArtifactConfig
    x, k, v = runners["layer_decode"](layer_weights(model, 0), x, cos, sin, past, k_rows, v_rows)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from neuronpack.backends.torch_aot.torch_api import aoti_package_loader, load_exported_programs
from neuronpack.errors import ArtifactError

if TYPE_CHECKING:
    from neuronpack.backends.torch_aot.artifact_config import ArtifactConfig


def load_runners(package: Path, config: ArtifactConfig, task) -> dict[str, Callable]:
    """name -> ``run(weights: dict[str, Tensor], *args) -> tuple`` for every graph of the artifact (the weights in
    the graph's input order: ``layer_weights`` / ``head_weights``)."""
    runners = {}
    if config.compiler == "aoti":
        for name, model_name in config.graphs.items():
            # The C++ loader directly: torch._inductor's Python wrapper would import dynamo and probe the
            # compiler's vector ISA (seconds), and re-read every model of the package for each graph.
            loader = aoti_package_loader(str(package), model_name)
            if loader.get_constant_fqns():  # weights are inputs: a graph holding constants is not ours
                raise ArtifactError(f"graph {name} expects constants {loader.get_constant_fqns()[:3]}",
                                    where=str(package), fix="recompile the artifact (neuronpack compile --force)")
            runners[name] = boxed(loader)
            task.advance()
        return runners
    programs = load_exported_programs(str(package))
    for name, model_name in config.graphs.items():
        runners[name] = exported(programs[model_name])
        task.advance()
    return runners


def boxed(loader) -> Callable:
    # Skip AOTICompiledModel.__call__'s per-call pytree flattening: the inputs are flat tensors already. The compiled
    # code indexes each input with the strides it was traced with (contiguous): a broadcast view (an expand's stride
    # 0) would be read as garbage, so every non-weight input is made contiguous (free when it already is).
    def run(weights: dict, *args):
        return tuple(loader.boxed_run([*weights.values(), *(a.contiguous() for a in args)]))

    return run


def exported(program) -> Callable:
    module = program.module()

    def run(weights: dict, *args):
        return tuple(module(weights, *args))

    return run
