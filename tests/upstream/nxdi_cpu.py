"""Run checkpoints through upstream NxD Inference's own model classes on a CPU, teacher-forced (a worker process).

Usage: ``python nxdi_cpu.py SPEC.json OUT.pt`` in ``.venv-nxdi`` (NxDI's transformers 4.57 beside this project's
packages). The spec names the upstream source directories (``sys_path``) and the runs: each a ``model_dir``, the
NeuronConfig kwargs neuronpack recorded (``neuron_config``), the NxDI class (``model_class``, as compile recorded it;
none: Llama), ``dtype`` and ``tokens`` / ``prompt_len``; a run with a
``draft_dir`` loads NxDI's fused-speculation model (target + EAGLE draft) and reports the weights loaded; one with
``load_only`` (LoRA, run in ``cwd``, the artifact) loads and reports its modules and LoRA weights; one with ``limits``
reports what neuronpack's check says NxDI cannot score for it (``upstream_limit``), with upstream's layer-boundary
markers and with the harness's substitution; one with ``judge`` (a file) runs the Gemma 3 judge's CPU run
(backends/nxd/defects.py) and reports its verdict. The closed
packages are served by ``closed_shim``, sealed once NxDI has imported (every family's modules) and the layer-boundary
markers are the identity (the harness's one substitution, closed_shim.SUBSTITUTED): from then on set-up, loading and
every forward must run open code only. The loading itself is neuronpack's (``neuronpack.accuracy.nxdi_cpu``), the code
``neuronpack eval`` runs.

Writes {run name: {logits, modules (class name counts), closed_calls} or {loaded: {draft_model: n, target_model:
m}, closed_calls} or {error, closed_calls}} to OUT.pt.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    sys.path[:0] = [str(Path(__file__).parent), str(ROOT), *spec["sys_path"]]
    import closed_shim

    closed_shim.install()
    import torch

    from neuronpack.accuracy import nxdi_cpu

    assert nxdi_cpu.nxdi_importable(), "upstream NxD Inference does not import from the given sources"
    nxdi_cpu.import_family_modules()  # before sealing: some run closed code at import (Qwen3-MoE's nki_jit())
    closed_shim.substitute_for_cpu()
    closed_shim.seal()
    nxdi_cpu.init_cpu_process_group(spec.get("port"))
    results = {}
    for name, run in spec["runs"].items():
        del closed_shim.CALLS[:]
        try:
            if run.get("draft_dir"):  # fused speculation: load target + draft (no CPU forward upstream)
                results[name] = {"loaded": nxdi_cpu.load_fused_spec_on_cpu(
                    run["model_dir"], run["neuron_config"], run["draft_dir"], dtype=run["dtype"],
                    seq_len=len(run["tokens"]) + 1, model_class=run.get("model_class"))}
                results[name]["closed_calls"] = list(closed_shim.CALLS)
                continue
            if run.get("judge"):  # the Gemma 3 judge's CPU run itself, in this process (defects.py runs it alone)
                from neuronpack.backends.nxd import defects

                verdict_file = Path(run["judge"])
                defects.run_judge(run["arch"], verdict_file)
                results[name] = {"verdict": json.loads(verdict_file.read_text())}
                continue
            if run.get("limits"):  # what neuronpack's check says it cannot score, with and without the substitution
                with closed_shim.upstream_markers():
                    upstream = nxdi_cpu.upstream_limit(run["neuron_config"], run.get("model_class"))
                results[name] = {"upstream": upstream,
                                 "harness": nxdi_cpu.upstream_limit(run["neuron_config"], run.get("model_class"))}
                continue
            os.chdir(run.get("cwd") or ROOT)  # LoRA: lora_ckpt_paths are relative to the artifact
            app, module = nxdi_cpu.load_on_cpu(run["model_dir"], run["neuron_config"], dtype=run["dtype"],
                                               seq_len=len(run["tokens"]) + 1, model_class=run.get("model_class"))
            if run.get("load_only"):  # no CPU forward for it upstream: the weights it loaded, by name
                results[name] = {"modules": dict(Counter(type(m).__name__ for m in module.modules())),
                                 "lora_weights": {k: float(v.abs().sum()) for k, v in module.state_dict().items()
                                                  if k.endswith((".lora_A.weight", ".lora_B.weight"))}}
                results[name]["closed_calls"] = list(closed_shim.CALLS)
                continue
            results[name] = {"logits": nxdi_cpu.prefix_logits(app, run["tokens"], run["prompt_len"]),
                             "modules": dict(Counter(type(m).__name__ for m in module.modules()))}
        except Exception as exc:  # NxDI (or the missing-weight check) refused it: the test decides if it should
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        results[name]["closed_calls"] = list(closed_shim.CALLS)
    torch.save(results, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
