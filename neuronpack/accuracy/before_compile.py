"""``compile --check-accuracy`` for nxd: NxD Inference's CPU run of the NeuronConfig and checkpoint about to be
compiled, before neuronx-cc starts, so a bad config or checkpoint fails in seconds rather than after the compile.

The check runs in a child process (``python -m neuronpack.accuracy.before_compile SUBJECT OUT``): NxDI's CPU set-up
(``NXD_CPU_MODE``, a one-rank process group and model-parallel state at tp 1) must not reach the compile that
follows in this process, and the CPU model's memory is returned before it starts. Where the check cannot run here
(NxD Inference not importable, the weights larger than free memory) the report is ``not_run`` with the reason and
the build goes on; a failed check or a checkpoint NxDI refuses raises ``AccuracyError`` and nothing is compiled.

Example::

    subject = subject_of(staging, "nxd", config, recipe, model_config, source_dir, "trn1.32xlarge",
                         neuron_config=config["neuron_config"])
    report = check_before_compile(subject, reporter)     # the report dict; AccuracyError when it fails
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from neuronpack.accuracy import check as checks
from neuronpack.accuracy.check import FAILED, NOT_RUN, PASSED, AccuracyReport, Subject, check_accuracy, nxd_cpu_refusal
from neuronpack.accuracy.metrics import THRESHOLDS
from neuronpack.errors import AccuracyError, NeuronpackError
from neuronpack.progress import NullReporter, Reporter

STAGE = "before_compile"


def check_before_compile(subject: Subject, reporter: Reporter) -> dict[str, Any]:
    """The accuracy report (``to_dict()``, without the staging path, ``stage``: before_compile) of ``subject`` run
    through NxD Inference on this CPU in a child process; AccuracyError when it fails or NxDI refuses the checkpoint,
    or when the config contradicts the checkpoint (a quantized one built as float: known without NxDI)."""
    checks.check_nxd_quantization(subject)
    reason = nxd_cpu_refusal(subject)
    if reason:
        reporter.warn(f"accuracy check before the Neuron compile not run: {reason}")
        report = AccuracyReport(NOT_RUN, subject, THRESHOLDS[subject.precision], 0, reason=reason).to_dict()
    else:
        report = _run_child(subject, reporter)
    report.pop("artifact")
    report["stage"] = STAGE
    if report["status"] == FAILED:
        raise AccuracyError(
            f"NxD Inference on this CPU disagrees with the reference: {'; '.join(report['failures'])}; the Neuron "
            "compile did not start", where=str(subject.reference_dir),
            fix="see `neuronpack eval` for the figures; fix the checkpoint or recipe, or compile without "
            "--check-accuracy")
    if report["status"] == PASSED:
        reporter.info(f"accuracy before the Neuron compile: passed (top-1 {report['summary']['top1_agreement']:.3f})")
    return report


def _run_child(subject: Subject, reporter: Reporter) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="neuronpack-accuracy-") as tmp:
        given, out = Path(tmp) / "subject.json", Path(tmp) / "report.json"
        given.write_text(json.dumps(asdict(subject), default=str))
        with reporter.task("accuracy check before the Neuron compile (NxD Inference on this CPU, tp 1)"):
            # NxD's logger writes its set-up lines on stdout, which is the compile's result channel: dropped
            proc = subprocess.run([sys.executable, "-m", __name__, str(given), str(out)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        if not out.is_file():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise AccuracyError(f"the accuracy check before the Neuron compile died (exit {proc.returncode}): "
                                f"{last}", where=str(subject.reference_dir),
                                fix="rerun with NEURONPACK_DEBUG=1, or compile without --check-accuracy")
        result = json.loads(out.read_text())
    if "error" in result:
        raise AccuracyError(result["error"]["what"], where=result["error"]["where"], fix=result["error"]["fix"])
    return result


def _child(given: Path, out: Path) -> None:
    data = json.loads(given.read_text())
    paths = {name: Path(data[name]) if data[name] else None
             for name in ("artifact_dir", "reference_dir", "draft_dir", "model_dir")}
    subject = Subject(**{**data, **paths})
    try:
        result = check_accuracy(subject, reporter=NullReporter()).to_dict()
    except NeuronpackError as exc:
        result = {"error": {"what": exc.what, "where": exc.where, "fix": exc.fix}}
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    _child(Path(sys.argv[1]), Path(sys.argv[2]))
