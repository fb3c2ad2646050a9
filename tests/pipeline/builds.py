"""The recipe the pipeline tests build with."""

from pathlib import Path

RECIPE = Path(__file__).parents[2] / "recipes" / "tiny-test.toml"
# Export-only graphs build in about a second each: enough to exercise the pipeline. AOTInductor is covered by the
# backend's own tests.
FAST = ["compiler=export"]
