"""From an artifact directory to a ready engine: manifest hints, compiled model, tokenizer, thread count.

Example::

    loaded = load_engine(Path("neuron-compiled-artifacts/3f2a..."))
    loaded.engine.generate(GenerationRequest(prompt_ids=(1, 2, 3), max_tokens=8))
    loaded.served_model_name      # "SmolLM2-135M-Instruct" (the recipe name or the model directory name)
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from neuronpack.errors import ServeError
from neuronpack.progress import NullReporter, Reporter
from neuronpack.runtime.adapters import ServedModels
from neuronpack.runtime.engine import Engine, EngineLimits
from neuronpack.runtime.engine.prefix_cache import PrefixCaching
from neuronpack.runtime.engine.speculation.config import SpeculationConfig
from neuronpack.runtime.tokenizer import ArtifactTokenizer

if TYPE_CHECKING:
    from neuronpack.artifacts.manifest import Manifest


@dataclass
class LoadedEngine:
    engine: Engine
    manifest: Manifest
    served_model_name: str
    load_seconds: float
    artifact_dir: Path | None = None

    def served_models(self) -> ServedModels:
        """The names this engine answers to: the served model name, then each LoRA adapter (``root`` its copy
        inside the artifact)."""
        from neuronpack.checkpoint.lora import lora_path

        names = self.engine.adapter_names
        roots = {n: str(self.artifact_dir / lora_path(n)) for n in names} if self.artifact_dir else {}
        return ServedModels([self.served_model_name], names, roots=roots)


def served_model_name(manifest: Manifest, artifact_dir: Path) -> str:
    """The name clients put in ``model``: the manifest's serve hint, else the artifact directory name."""
    return manifest.serve.served_model_name or Path(artifact_dir).name


def load_engine(
    artifact_dir: Path,
    *,
    manifest: Manifest | None = None,
    num_threads: int | None = None,
    reporter: Reporter | None = None,
    limits: EngineLimits | None = None,
    speculation: bool = True,
    prefix_caching: PrefixCaching | None = None,
) -> LoadedEngine:
    """Load a torch-framework artifact into an Engine (not started), with ``limits`` on its queue and request time.
    An artifact compiled with ``[speculation]`` speculates unless ``speculation`` is False (then it decodes one
    token per step, exactly as an artifact without speculation). ``prefix_caching``: the prefix cache's settings
    (default: on, ``PrefixCaching()``). ServeError for other frameworks.

    Example: ``load_engine(path).engine.max_model_len``.
    """
    from neuronpack.artifacts.manifest import read_manifest
    from neuronpack.backends.torch_aot import load_artifact

    reporter = reporter or NullReporter()
    started = time.perf_counter()
    artifact_dir = Path(artifact_dir)
    manifest = manifest if manifest is not None else read_manifest(artifact_dir)
    framework = manifest.framework
    if framework != "torch":
        raise ServeError(
            f"the built-in runtime serves torch artifacts; this one is {framework!r}",
            where=str(artifact_dir),
            fix="serve it with `neuronpack serve` on a Neuron machine (it launches vLLM for Neuron artifacts)",
        )
    configure_threads(num_threads)
    model = load_artifact(artifact_dir, reporter=reporter)
    tokenizer = ArtifactTokenizer.from_dir(artifact_dir)
    recorded = manifest.compile_config.get("speculation")  # what neuron_config.json says the graphs verify
    engine = Engine(
        model,
        tokenizer,
        max_model_len=manifest.serve.max_model_len,
        global_topk=manifest.recipe.sampling.global_topk,
        limits=limits,
        speculation=SpeculationConfig.from_dict(recorded, artifact_dir) if recorded and speculation else None,
        prefix_caching=prefix_caching,
    )
    return LoadedEngine(engine, manifest, served_model_name(manifest, artifact_dir), time.perf_counter() - started,
                        artifact_dir)


def available_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def configure_threads(num_threads: int | None = None) -> int:
    """Set torch's intra-op threads: the given number, else every core this process may run on."""
    import torch

    torch.set_num_threads(max(1, num_threads or available_cores()))
    return torch.get_num_threads()
