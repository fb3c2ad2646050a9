"""The graph key: what makes two builds share their compiled graphs.

The artifact key (key.py) identifies an artifact by its exact content, weights included. The graph key is derived
from the same key inputs minus what only the weights' *values* decide, so two checkpoints of one shape (a new
fine-tune, a merged LoRA, a re-quantization with new scales and the same dtypes) have one graph key and need one
compile. What stays in: framework, toolchain versions and target; the resolved recipe and bucket plan; config.json
minus cosmetic keys; every tensor's name, dtype and shape (model, draft, LoRA adapters); the digest of neuronpack's
own source that builds the graphs (``code``). What goes: the weight files' digests, the tokenizer and generation
files, the adapters' names and bytes (their configs and tensor shapes stay), and fields a backend declares
serving-only (``Backend.graph_key_ignores``). docs/architecture.md has the table, field by field.

The danger is one way: a graph input left out of this key serves a wrong graph, so the key errs towards too much,
and ``graph_key_inputs`` refuses a key input it does not know (a new artifact-key field must be placed here too).
Torch-free; computed on a miss only (a cache hit never needs it).

Example::

    inputs = graph_key_inputs(key_inputs, code=code_digest("torch"), lora_dirs={})
    graph_key = compute_key(inputs)     # 64 hex chars, equal for two fine-tunes of one model
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from neuronpack.digest import sha256_json

GRAPH_KEY_SCHEMA = 1
# Key inputs and what the graph key keeps of them (every key input must be named here: see graph_key_inputs).
KEPT_AS_IS = ("key_schema", "framework", "versions", "target")
SHAPES_ONLY = ("model", "draft")  # config + tensor names / dtypes / shapes, without the files' digests
DROPPED = ("aux_files",)  # tokenizer, generation and chat-template files: read by the server, never by a graph
# The neuronpack sources a framework's graphs are made by (relative to the package; a changed file is another graph).
GRAPH_SOURCES: dict[str, tuple[str, ...]] = {
    "torch": ("models/**/*.py", "kernels/*", "backends/torch_aot/*.py", "buckets.py"),  # models/families/ too
    "nxd": ("backends/nxd/*.py", "backends/neuron/common.py", "buckets.py"),
    "tnx": ("backends/tnx/*.py", "backends/neuron/common.py", "buckets.py"),
    "vneuron": ("backends/vneuron/*.py", "backends/neuron/common.py", "buckets.py"),
}
_PACKAGE = Path(__file__).resolve().parents[1]


def graph_key_inputs(key_inputs: Mapping[str, Any], *, code: str, lora_dirs: Mapping[str, Path] | None = None,
                     ignore: Iterable[str] = ()) -> dict[str, Any]:
    """The graph key's inputs, derived from the artifact key's (``key_inputs``): see the module docstring.
    ``code``: ``code_digest(framework)``; ``lora_dirs``: each adapter's resolved directory (its config and tensor
    shapes are keyed, not its bytes); ``ignore``: dotted paths inside ``compile`` that only serving reads."""
    unknown = sorted(set(key_inputs) - {*KEPT_AS_IS, *SHAPES_ONLY, *DROPPED, "compile", "lora"})
    if unknown:  # a new artifact-key input: decide here whether it shapes a graph
        raise ValueError(f"graph_key_inputs does not know the key input(s) {', '.join(unknown)}")
    out: dict[str, Any] = {"graph_key_schema": GRAPH_KEY_SCHEMA, "code": code}
    out.update({name: key_inputs[name] for name in KEPT_AS_IS if name in key_inputs})
    for name in SHAPES_ONLY:
        if name in key_inputs:
            checkpoint = key_inputs[name]
            out[name] = {"config": checkpoint["config"], "tensors": checkpoint["weights"]["tensors"]}
    compile_inputs = copy.deepcopy(dict(key_inputs["compile"]))
    if isinstance(compile_inputs.get("lora"), dict):
        compile_inputs["lora"].pop("adapters", None)  # names: what a request asks for, not a graph input
    for path in ignore:
        _drop(compile_inputs, path.split("."))
    out["compile"] = compile_inputs
    if "lora" in key_inputs:
        adapters = [adapter_shape(Path(d)) if Path(d).is_dir() else {"reference": str(d)}
                    for d in (lora_dirs or {}).values()]
        out["lora"] = sorted(adapters, key=sha256_json)
    return out


def compute_graph_key(inputs: Mapping[str, Any]) -> str:
    return sha256_json(dict(inputs))


def code_digest(framework: str) -> str:
    """sha256 over the neuronpack sources that make ``framework``'s graphs (names and bytes, sorted)."""
    files = sorted({p for pattern in GRAPH_SOURCES.get(framework, ()) for p in _PACKAGE.glob(pattern)
                    if p.is_file() and p.suffix not in (".so", ".pyc")})
    return sha256_json({str(p.relative_to(_PACKAGE)): p.read_bytes().hex() for p in files})


def adapter_shape(adapter_dir: Path) -> dict[str, Any]:
    """A PEFT adapter without its values: adapter_config.json and every safetensors tensor's name, dtype and shape
    (any other weight file, a pickled ``adapter_model.bin``, by content: its header cannot be read safely)."""
    from neuronpack.checkpoint.safetensors_header import read_safetensors_header
    from neuronpack.digest import file_sha256

    root = Path(adapter_dir)
    config_path = root / "adapter_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else None
    tensors: dict[str, Any] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != "adapter_config.json"):
        if path.suffix == ".safetensors":
            tensors.update({i.name: [i.dtype, list(i.shape)] for i in read_safetensors_header(path).values()})
        elif path.suffix in (".bin", ".pt", ".pth"):
            tensors[str(path.relative_to(root))] = file_sha256(path)
    return {"config": config, "tensors": tensors}


def _drop(data: dict[str, Any], parts: list[str]) -> None:
    node = data
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return
    node.pop(parts[-1], None)
