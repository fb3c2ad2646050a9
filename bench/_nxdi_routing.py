"""Route lengths with upstream NxD Inference's own ``ModelWrapper.get_target_bucket`` (a worker process).

Usage: ``python _nxdi_routing.py SPEC.json OUT.json`` in ``.venv-nxdi`` (NxDI's transformers 4.57; the closed Neuron
packages served by tests/upstream/closed_shim.py, sealed once NxDI has imported, so routing runs open code only).
SPEC: {"sys_path": [the NxDI and NxD src dirs], "jobs": [{"tag": "context_encoding_model" |
"token_generation_model", "buckets": [...], "lengths": [...]}]}; OUT: one list of buckets per job, in order. The
wrapper is not built (that traces a model): ``get_target_bucket`` runs bound to an object holding exactly what it
reads (neuron_config.buckets / speculation_length / allow_input_truncation, tag, is_batch_bucketing), given an
attention mask of each length as upstream's generation passes it (args[1]).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    sys.path[:0] = [str(ROOT / "tests" / "upstream"), *spec["sys_path"]]
    import closed_shim

    closed_shim.install()
    import torch
    from neuronx_distributed_inference.models.model_wrapper import ModelWrapper

    closed_shim.seal()
    out = []
    for job in spec["jobs"]:
        wrapper = types.SimpleNamespace(
            neuron_config=types.SimpleNamespace(buckets=list(job["buckets"]), allow_input_truncation=False,
                                                speculation_length=job.get("speculation_length", 0)),
            tag=job["tag"], is_batch_bucketing=False)
        wrapper._get_seq_bucket = types.MethodType(ModelWrapper._get_seq_bucket, wrapper)
        out.append([ModelWrapper.get_target_bucket(wrapper, None, torch.ones(1, length, dtype=torch.int32))
                    for length in job["lengths"]])
    assert not closed_shim.CALLS, closed_shim.CALLS
    Path(out_path).write_text(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:3])
