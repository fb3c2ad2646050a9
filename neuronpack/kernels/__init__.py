"""neuronpack's own CPU kernels (linear.cpp: the decode linears; int8_row.cpp: int8 weights against one row;
int8_rows.cpp: int8 weights against 2-16 rows, x rounded to int16 per row; int8_gemm.cpp: int8 weights
against more rows (a prefill) as integer GEMMs, or for many bfloat16 rows bfloat16 GEMMs on cache-sized tiles of
the weights; attention.cpp: the decode attention; simd.h: what they share), compiled with the C++ compiler torch
uses.

``load_kernels()`` registers ``torch.ops.neuronpack.linear(x, weight, bias=None)`` and
``torch.ops.neuronpack.linear_int8(x, weight, scale, bias=None)``: ``x @ weight.T`` (+ bias) with the result in
``x``'s dtype, for float32 / bfloat16 weights of ``x``'s dtype and for int8 weights with a float32 per-channel scale.
Up to 16 rows of ``x`` run neuronpack's kernel, which reads each weight once at close to the machine's streaming
read bandwidth; more rows (prefill) and CPUs without AVX-512 run ``at::linear``, except rows against int8 weights:
float32 rows and up to 128 bfloat16 ones run torch's integer GEMM (``at::_int_mm``, oneDNN) on two int8 rows per row
of ``x``, more bfloat16 rows a bfloat16 GEMM per 4 MiB tile of the weights converted (docs/quantize.md). It also
registers ``torch.ops.neuronpack.decode_attention(q, k, v, k_past, v_past, past, scale)``: one query token per row
against its cached keys and values and its own (the formula ``models.llama.Attention`` runs in torch ops; see
attention.cpp).

The library is built for the CPU capability torch reports (AVX512: ``-march=x86-64-v4``, the same machines an
AOTInductor artifact built here runs on), with OpenMP, once per source, torch, compiler and flags, into
``$NEURONPACK_CACHE_DIR/kernels/<digest>/`` (~10 s, then reused). A portable artifact ships a copy
(``neuronpack_kernels.so``) and its loader registers that one, so a serving machine needs no compiler.
The first library a process loads serves it (every build of one neuronpack implements the same ops; an artifact of
another format is refused before its copy loads).

Example::

    from neuronpack.kernels import load_kernels

    load_kernels()                                   # this machine's build
    load_kernels(artifact / "neuronpack_kernels.so")  # or an artifact's copy
    y = torch.ops.neuronpack.linear(x, weight)       # x [..., in], weight [out, in] -> [..., out]
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from neuronpack.errors import ArtifactError, NeuronpackError

SOURCES = tuple(Path(__file__).with_name(name) for name in ("linear.cpp", "int8_row.cpp", "int8_rows.cpp",
                                                           "int8_gemm.cpp", "attention.cpp", "moe.cpp"))
HEADERS = tuple(Path(__file__).with_name(name) for name in ("simd.h", "int8_row.h", "moe_dots.h"))


class KernelBuildError(NeuronpackError):
    """neuronpack's C++ kernels could not be compiled on this machine."""


LIBRARY_NAME = "neuronpack_kernels.so"
_loaded: list[Path] = []


def load_kernels(library: Path | None = None) -> None:
    """Register the ``torch.ops.neuronpack`` ops in this process from ``library`` (default: this machine's build,
    built first if missing). Idempotent: once a library is loaded, later calls change nothing."""
    if library is not None and not Path(library).is_file():  # checked even when another library serves already
        raise ArtifactError(f"{LIBRARY_NAME} is missing: the graphs call its kernels", where=str(Path(library).parent),
                            fix="recompile the artifact (neuronpack compile --force)")
    if _loaded:
        return
    import torch

    library = Path(library) if library is not None else machine_library()
    torch.ops.load_library(str(library))
    _register_shapes()
    _loaded.append(library)


def machine_library() -> Path:
    """This machine's build of the library (built now if this source, torch, compiler and flags have none yet)."""
    library = _library_path()
    if not library.exists():
        _build(library)
    return library


def has_kernel() -> bool:
    """Whether this machine runs neuronpack's kernel (AVX-512), rather than ``at::linear`` for every row count."""
    import torch

    load_kernels()
    return bool(torch.ops.neuronpack.has_kernel())


def _register_shapes() -> None:
    """Shapes of the ops' outputs for tracing (export's fake tensors)."""
    import torch

    @torch.library.register_fake("neuronpack::linear")
    def _linear(x, weight, bias=None):
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @torch.library.register_fake("neuronpack::linear_int8")
    def _linear_int8(x, weight, scale, bias=None):
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @torch.library.register_fake("neuronpack::decode_attention")
    def _decode_attention(q, k, v, k_past, v_past, past, scale):
        return q.new_empty(q.shape)

    @torch.library.register_fake("neuronpack::routed_experts")
    def _routed_experts(x, expert_ids, expert_weights, gate_up, down, gate_up_scale, down_scale, gate_up_bias,
                        down_bias, alpha, limit, up_offset):
        return x.new_empty(x.shape)


def _library_path() -> Path:
    from neuronpack.digest import cache_dir

    return cache_dir() / "kernels" / _build_digest() / LIBRARY_NAME


def _build_digest() -> str:
    """The source, the torch build it links against, the compiler and its flags."""
    import torch

    h = hashlib.sha256()
    for path in (*SOURCES, *HEADERS):
        h.update(path.read_bytes())
    for part in (torch.__version__, torch.__file__, _compiler(), platform.machine(), *_code_flags()):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:24]


def _isa_flags() -> list[str]:
    """Instruction set of the build: that of torch's CPU capability here (an AOTInductor artifact's graphs are
    compiled for it too, and refused on machines without it), not ``-march=native``."""
    import torch

    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    capability = torch.backends.cpu.get_cpu_capability()
    if capability.startswith("AVX512"):
        return ["-march=x86-64-v4", "-mtune=generic"]
    return ["-march=x86-64-v3", "-mtune=generic"] if capability == "AVX2" else []


def _code_flags() -> list[str]:
    """The flags that decide the code: the ISA, and OpenMP, without which ``at::parallel_for`` (an inline template
    here, as in torch's OpenMP build) runs every linear on one thread whatever ``torch.set_num_threads`` says. The
    library then uses the ``libgomp.so.1`` torch already loaded (same soname): one thread pool and thread count."""
    return ["-O3", *_isa_flags(), "-std=c++17", "-fopenmp"]


def _compiler() -> str:
    return os.environ.get("CXX", "c++")


def _build(library: Path) -> None:
    """Compile the kernels' sources into ``library`` (built in a temporary directory and renamed: concurrent builders
    never see, or leave, half a library)."""
    import torch
    from torch.utils import cpp_extension

    if shutil.which(_compiler()) is None:
        raise KernelBuildError(f"no C++ compiler ({_compiler()}) to build neuronpack's kernels",
                               fix="install one (e.g. apt-get install g++) or set CXX")
    library.parent.mkdir(parents=True, exist_ok=True)
    abi = int(torch.compiled_with_cxx11_abi())  # public: torch's private API stays in backends/torch_aot/torch_api.py
    with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
        out = Path(tmp) / library.name
        command = [_compiler(), *_code_flags(), "-shared", "-fPIC", "-w",
                   f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DTORCH_EXTENSION_NAME=neuronpack_kernels",
                   *(f"-I{p}" for p in cpp_extension.include_paths()), *map(str, SOURCES), "-o", str(out),
                   *(f"-L{p}" for p in cpp_extension.library_paths()), "-lc10", "-ltorch_cpu", "-ltorch",
                   *(f"-Wl,-rpath,{p}" for p in cpp_extension.library_paths())]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise KernelBuildError(f"compiling neuronpack's kernels failed: {last}", where=str(SOURCES[0].parent),
                                   fix="check the C++ compiler (CXX) can build PyTorch extensions")
        os.replace(out, library)
