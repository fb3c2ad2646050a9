"""Run code in a fresh Python interpreter and report whether it imported torch (the CLI start, cache-hit and
selection paths must not: importing torch costs ~1.2 s)."""

from __future__ import annotations

import subprocess
import sys

_MARK = "__torch_imported__"


def run_fresh(code: str) -> tuple[str, bool]:
    """Run ``code`` with ``python -c``; return (its stdout, stripped; whether torch was imported by the end)."""
    probe = f"{code}\nimport sys as _sys\nprint({_MARK!r}, 'torch' in _sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    body, _, flag = out.rpartition(_MARK)
    return body.strip(), flag.strip() == "True"
