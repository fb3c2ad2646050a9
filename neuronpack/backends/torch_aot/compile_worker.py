"""Graphs compiled in their own interpreter (see compile.py): ``python -m neuronpack.backends.torch_aot.compile_worker
JOB_JSON`` writes ``{name: {"files": [...], "seconds": s}}`` to the job's result path, or exits non-zero with the
error as its last output line."""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    import torch

    from neuronpack.backends.torch_aot.artifact_config import ArtifactConfig
    from neuronpack.backends.torch_aot.compile import compile_in_this_process
    from neuronpack.backends.torch_aot.graphs import GraphLimits

    job = json.loads(argv[0])
    config, limits = ArtifactConfig.from_dict(job["config"]), GraphLimits(**job["limits"])
    torch.set_num_threads(1)  # one core per worker: the other workers have the others
    done = {}
    try:
        for name, files, seconds in compile_in_this_process(job["weights_dir"], config, limits, job["names"]):
            done[name] = {"files": [str(f) for f in files], "seconds": seconds}
    except Exception as exc:  # the parent turns the last line into one BuildError
        print(f"{type(exc).__name__}: {exc}".replace("\n", " ")[:400], flush=True)
        return 1
    with open(job["result"], "w") as out:
        json.dump(done, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
