"""Start-up of a Python process that runs neuronpack against upstream NxD Inference sources (tests/upstream).

On PYTHONPATH only in those tests' subprocesses: puts NEURONPACK_UPSTREAM_PATH's directories first on sys.path,
serves the closed Neuron packages (closed_shim), imports NxDI (every family's modules), makes the layer-boundary
markers the identity (closed_shim.SUBSTITUTED, the harness's one substitution) and seals the shim, so any later
call into closed code raises; at exit the calls recorded (even ones upstream swallowed) go to NEURONPACK_CLOSED_CALLS
as JSON.
"""

import atexit
import json
import os
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]),
                *os.environ.get("NEURONPACK_UPSTREAM_PATH", "").split(os.pathsep)]
import closed_shim  # noqa: E402

closed_shim.install()
from neuronpack.accuracy import nxdi_cpu  # noqa: E402

if nxdi_cpu.nxdi_importable():
    nxdi_cpu.import_family_modules()  # before sealing: some run closed code at import (Qwen3-MoE's nki_jit())
    closed_shim.substitute_for_cpu()
    if os.environ.get("NEURONPACK_UPSTREAM_FIX") == "gemma3":  # an NxDI that fixed Gemma 3, simulated in memory
        import gemma3_fix  # noqa: F401
    closed_shim.seal()
if os.environ.get("NEURONPACK_CLOSED_CALLS"):
    atexit.register(lambda: Path(os.environ["NEURONPACK_CLOSED_CALLS"]).write_text(json.dumps(closed_shim.CALLS)))
