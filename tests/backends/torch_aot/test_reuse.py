"""A fine-tune built on a donor's AOTInductor graphs and kernels library generates transformers' greedy tokens for
the NEW weights (not the donor's): the graphs take every weight as an input, so reusing them is exact."""

from __future__ import annotations

import pytest
import transformers

from neuronpack.backends.torch_aot import load_artifact
from neuronpack.kernels import LIBRARY_NAME
from neuronpack.pipeline import compile_model
from tests.backends.torch_aot.test_generate import greedy_batch, hf_greedy, random_prompts
from tests.helpers.tiny_models import fine_tune_copy
from tests.pipeline.builds import RECIPE

pytestmark = pytest.mark.slow
SETS = ["compiler=aoti", "target.batch_size=3"]


def test_reused_aoti_graphs_give_transformers_tokens_for_the_new_weights(tiny_llama, tmp_path):
    root = tmp_path / "root"
    donor = compile_model(str(tiny_llama), recipe=RECIPE, overrides=SETS, out_root=root)
    tuned = fine_tune_copy(tiny_llama, tmp_path / "fine-tune", scale=1.2, seed=7)
    reused = compile_model(str(tuned), recipe=RECIPE, overrides=SETS, out_root=root)
    assert reused.graphs_from["key"] == donor.key and reused.graphs_from["files"] == 2  # graphs.pt2 + kernels
    for name in ("graphs.pt2", LIBRARY_NAME):
        assert (reused.path / name).stat().st_ino == (donor.path / name).stat().st_ino
    assert reused.timings["build"] < donor.manifest.graphs["seconds"]

    prompts = random_prompts((5, 15, 40), seed=3)
    new = transformers.AutoModelForCausalLM.from_pretrained(tuned).eval()
    old = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    expected = [hf_greedy(new, p, 32) for p in prompts]
    assert expected != [hf_greedy(old, p, 32) for p in prompts]  # the fine-tune answers differently
    assert greedy_batch(load_artifact(reused.path), prompts, 32) == expected
