"""The one module that calls torch's private (underscore) export / inductor APIs: each behind a small named
function, so a torch upgrade that moves one breaks here, in one place, with a name that says what neuronpack needs.

Tested with torch 2.13.0 (the test suite's torch). pyproject.toml admits torch >=2.9,<2.14: 2.9 is the torch of
Neuron SDK 2.29's torch-neuronx, reported to work for the nxd path; this module's calls were not re-run on 2.9 here.
Where the public API gives the same behaviour neuronpack uses it instead (``torch.compiled_with_cxx11_abi()`` in
kernels/); what is here has no public equivalent with the same behaviour, and each docstring says why.

Example::

    files = aoti_compile(module, example_args, options)         # AOTInductor's files for one graph
    package_aoti_graphs(buffer, {"layer_decode": files, ...})   # several graphs in one .pt2, weights outside
    loader = aoti_package_loader("graphs.pt2", "layer_decode")  # the C++ loader of one graph
"""

from __future__ import annotations

from typing import Any


def aoti_compile(module, example_args: tuple, options: dict[str, Any]):
    """AOTInductor-compile one graph module to the list of files it wrote (``options`` must ask for
    ``aot_inductor.package``): ``torch._inductor.aot_compile``.

    Why not public ``torch._inductor.aoti_compile_and_package``: it compiles and packages one program into its own
    .pt2; neuronpack compiles each graph separately (in parallel worker processes, which report the files) and
    packages all of them into one .pt2 (``package_aoti_graphs``). Tested with torch 2.13.0."""
    import torch._inductor

    return torch._inductor.aot_compile(module, example_args, options=options)


def package_aoti_graphs(archive, compiled: dict[str, Any]) -> None:
    """Write several AOTInductor-compiled graphs (model name -> ``aoti_compile``'s files) into one .pt2 ``archive``
    (a path or a binary file object): ``torch._inductor.package.package_aoti``.

    Why private: the public ``aoti_compile_and_package`` writes one model per package (see ``aoti_compile``).
    Tested with torch 2.13.0."""
    from torch._inductor.package import package_aoti

    package_aoti(archive, compiled)


def package_exported_programs(archive, programs: dict[str, Any]) -> None:
    """Write several ``ExportedProgram``s (model name -> program) into one .pt2 ``archive``:
    ``torch.export.pt2_archive._package.package_pt2``.

    Why not public ``torch.export.save``: it saves one program per file. Tested with torch 2.13.0."""
    from torch.export.pt2_archive._package import package_pt2

    package_pt2(archive, exported_programs=programs)


def load_exported_programs(path: str) -> dict[str, Any]:
    """model name -> ``ExportedProgram`` of a .pt2 written by ``package_exported_programs``:
    ``torch.export.pt2_archive._package.load_pt2``.

    Why not public ``torch.export.load``: it loads one program per file. Tested with torch 2.13.0."""
    from torch.export.pt2_archive._package import load_pt2

    return load_pt2(path).exported_programs


def aoti_package_loader(path: str, model_name: str):
    """The C++ ``AOTIModelPackageLoader`` of one model of an AOTInductor .pt2 (one runner, single-threaded off, the
    default device): ``torch._C._aoti.AOTIModelPackageLoader(path, model_name, False, 1, -1)``. Callers use its
    ``boxed_run(list)`` and ``get_constant_fqns()``.

    Why not public ``torch._inductor.aoti_load_package``: it loads only the package's default model, not a named
    one of several; and it (like ``torch._inductor.package.load_package``, which does take a name) goes through
    torch._inductor's Python wrapper, which imports dynamo and probes the compiler's vector ISA (seconds) and wraps
    each call in pytree flattening. Tested with torch 2.13.0 (positional arguments: the names are not
    part of the binding's contract)."""
    import torch

    return torch._C._aoti.AOTIModelPackageLoader(str(path), model_name, False, 1, -1)
