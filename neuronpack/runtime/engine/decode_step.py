"""One decode step, run and sampled: the engine's decode plan (``StepPlan.decodes``) on the model, one token per
running sequence, or with speculation a draft-then-verify step (``speculation/step.py``) that may accept several.
Either way each sequence's outcome is an ``Accepted`` (its tokens, logprobs and draft counts), which the engine puts
through the stop rules one token at a time (core.py; whatever follows a stop is dropped). Speculating, sequences end
with "length" once ``length + lookahead`` would pass ``max_model_len`` (requests.py), so a verify call always fits.
The step's seconds feed the metrics and the step budget.

Example::

    decoder = DecodeStep(runner, metrics, step_budget, batch_size=8, speculating=False)
    outcomes = decoder.run(plan, running)      # [Accepted([token], 0, 0, logprobs), ...] in plan order
"""

from __future__ import annotations

import time

from neuronpack.runtime.engine.metrics import EngineMetrics
from neuronpack.runtime.engine.plan import StepPlan
from neuronpack.runtime.engine.requests import RequestState
from neuronpack.runtime.engine.runner import ModelRunner
from neuronpack.runtime.engine.sampling import sample
from neuronpack.runtime.engine.speculation.acceptance import Accepted
from neuronpack.runtime.engine.speculation.step import SpecRow
from neuronpack.runtime.engine.step_budget import StepBudget
from neuronpack.runtime.structured import Masks


class DecodeStep:
    """The decode half of an engine step (the prefill half is the engine's own, since it admits and forks)."""

    def __init__(self, runner: ModelRunner, metrics: EngineMetrics, step_budget: StepBudget, *, batch_size: int,
                 speculating: bool) -> None:
        self.runner = runner
        self.metrics = metrics
        self.step_budget = step_budget
        self.batch_size = batch_size
        self.speculating = speculating

    def run(self, plan: StepPlan, running: list[RequestState]) -> list[Accepted]:
        """The outcome of every decode row of ``plan`` (``running[i]`` is the sequence in row ``plan.decodes[i]``);
        raises what the model raises (the engine fails those sequences)."""
        started = time.monotonic()
        outcomes = self._speculate(plan, running) if self.speculating else self._one_token(plan, running)
        seconds = time.monotonic() - started
        self.metrics.decode_seconds.observe(seconds)
        self.step_budget.observe_decode(seconds)
        self.metrics.step_occupancy.observe(len(running) / self.batch_size)
        return outcomes

    def _one_token(self, plan: StepPlan, running: list[RequestState]) -> list[Accepted]:
        masks = Masks.start([s.constraint for s in running])  # grammar masks computed while the model runs
        logits = self.runner.decode(plan.decodes)  # [n_running, vocab]
        next_tokens, entries = sample(masks.apply(logits), [s.sampler for s in running])
        return [Accepted([token], 0, 0, None if entry is None else [entry])
                for token, entry in zip(next_tokens.tolist(), entries, strict=True)]

    def _speculate(self, plan: StepPlan, running: list[RequestState]) -> list[Accepted]:
        rows = [SpecRow(d.request_id, d.row, d.position, [*s.prompt_ids, *s.output.token_ids], d.num_draft,
                        s.sampler, s.constraint) for d, s in zip(plan.decodes, running, strict=True)]
        outcomes, stats = self.runner.speculate(rows)
        self.metrics.observe_speculation(stats)
        return outcomes
