"""One graph compiled in its own interpreter (see compile.py): ``python -m neuronpack.backends.torch_aot.compile_worker
JOB_JSON`` writes ``{"files": [...], "seconds": s}`` to the job's result path, or exits non-zero with the error as
its last output line."""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    import torch

    from neuronpack.backends.torch_aot.compile import compile_in_this_process
    from neuronpack.backends.torch_aot.graphs import GraphLimits

    job = json.loads(argv[0])
    torch.set_num_threads(1)  # one core per graph: the other worker has the other one
    try:
        _, files, seconds = compile_in_this_process(job["weights_dir"], job["config"], GraphLimits(**job["limits"]),
                                                    job["kind"])
    except Exception as exc:  # the parent turns the last line into one BuildError
        print(f"{type(exc).__name__}: {exc}".replace("\n", " ")[:400], flush=True)
        return 1
    with open(job["result"], "w") as out:
        json.dump({"files": [str(f) for f in files], "seconds": seconds}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
