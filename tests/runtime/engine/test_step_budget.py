"""The step's token budget without a model: fixed when given, else following the measured decode and prefill times
so that a stream's gap stays near ``GAP_STEPS`` decode steps, within ``MIN_CHUNK`` and the largest bucket."""

from __future__ import annotations

from neuronpack.runtime.engine.step_budget import FIRST_CHUNK, GAP_STEPS, MIN_CHUNK, StepBudget
from tests.helpers.fresh_interpreter import run_fresh


def test_a_fixed_budget_is_the_step_whatever_the_timings():
    budget = StepBudget(64, max_chunk=512)
    budget.observe_decode(1.0)
    assert budget.step_tokens(4) == 64 and not budget.automatic


def test_the_automatic_chunk_takes_about_one_and_a_half_decode_steps():
    budget = StepBudget(None, max_chunk=512)
    assert budget.step_tokens(3) == 3 + FIRST_CHUNK  # nothing measured yet
    budget.observe_decode(0.030)
    budget.observe_prefill(0.300, 100)  # 3 ms a token
    assert budget.chunk_tokens() == int((GAP_STEPS - 1) * 0.030 / 0.003) == 15
    assert budget.step_tokens(2) == 17
    for _ in range(20):  # a much slower prefill (a busy machine): never below one block
        budget.observe_prefill(1.0, 10)
    assert budget.chunk_tokens() == MIN_CHUNK
    for _ in range(20):  # a fast one: never above the largest bucket
        budget.observe_prefill(0.001, 1000)
    assert budget.chunk_tokens() == 512


def test_the_step_budget_imports_no_torch():
    _, torch_imported = run_fresh("import neuronpack.runtime.engine.step_budget")
    assert not torch_imported
