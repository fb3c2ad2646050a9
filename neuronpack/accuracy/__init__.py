"""Accuracy checks: an artifact against the checkpoint it was compiled from, teacher-forced (``neuronpack eval`` and
``neuronpack compile --check-accuracy``). Importing this package does not import torch."""

from neuronpack.accuracy.check import (
    FAILED,
    NOT_RUN,
    PASSED,
    AccuracyReport,
    Subject,
    check_accuracy,
    subject_from_manifest,
    with_thresholds,
)
from neuronpack.accuracy.metrics import THRESHOLDS, Thresholds
from neuronpack.accuracy.prompts import DEFAULT_PROMPTS, EvalPrompt, load_prompts

__all__ = ["DEFAULT_PROMPTS", "FAILED", "NOT_RUN", "PASSED", "THRESHOLDS", "AccuracyReport", "EvalPrompt", "Subject",
           "Thresholds", "check_accuracy", "load_prompts", "subject_from_manifest", "with_thresholds"]
