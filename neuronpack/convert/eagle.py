"""Turn an EAGLE draft (EAGLE-1/2 or EAGLE-3, any checkpoint layout) into the draft checkpoint NxDI loads.

NxDI needs the target's ``lm_head.weight`` inside an EAGLE-1/2 draft, and for an EAGLE-3 draft ``layers.0.*`` names
plus the target's ``embed_tokens.weight``. ``convert_eagle`` validates everything from headers first
(``eagle_layouts.plan_eagle_conversion``), then streams (``eagle_stream.TensorStream``): a tensor kept unchanged
from a safetensors file is copied file to file by the kernel; a safetensors tensor that is cast is cast on its stored
bytes in row chunks (``float_cast``, bit for bit torch's cast), so safetensors inputs never need torch. Only a
``.bin`` draft (or rows holding a NaN) go through torch: draft tensors one at a time (large ones in row chunks), the
target's head/embedding in row chunks. The target's other weights are never read. OUT is written atomically:
safetensors (+ index when sharded), ``config.json`` with NxDI's keys, the draft's tokenizer files and
``neuronpack-eagle.json`` (what was added, renamed and cast, with source digests).

Example::

    result = convert_eagle("EAGLE-LLaMA3-Instruct-8B", "Meta-Llama-3-8B-Instruct", Path("draft-nxd"))
    result.layout, [a["name"] for a in result.added]     # ("eagle1", ["lm_head.weight"])
    eagle_nxd_hints(Path("draft-nxd"))["enable_eagle_speculation"]     # True
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from neuronpack import __version__
from neuronpack.checkpoint import Checkpoint, TensorSpec, copy_aux_files, open_checkpoint, write_safetensors_sharded
from neuronpack.checkpoint.writer import DEFAULT_MAX_SHARD_BYTES
from neuronpack.convert.eagle_layouts import (
    EMBED,
    FLOAT_CODES,
    FLOAT_DTYPES,
    HEAD,
    EaglePlan,
    detect_layout,
    plan_eagle_conversion,
)
from neuronpack.convert.eagle_stream import TensorStream
from neuronpack.convert.float_cast import warm_up
from neuronpack.digest import file_sha256
from neuronpack.errors import ConversionError
from neuronpack.fsutil import atomic_output_dir, check_output_path
from neuronpack.progress import NullReporter, Reporter

MANIFEST = "neuronpack-eagle.json"
CONFIG_SECTION = "neuronpack_eagle"


@dataclass(frozen=True)
class EagleResult:
    """What convert_eagle wrote. ``head_identical`` is None unless an existing draft head was replaced."""

    out: Path
    layout: str  # "eagle1" | "eagle3"
    dtype: str  # floating dtype of the added tensors (and of every float tensor when --dtype was explicit)
    added: tuple[dict, ...]  # {"name", "from", "file", "dtype", "shape"}
    renamed: dict[str, str]
    casts: tuple[dict, ...]  # {"name", "from", "to"}
    head_identical: bool | None
    files: tuple[str, ...]  # file names written into out
    nxd_hints: dict

    def to_dict(self) -> dict:
        return {
            "out": str(self.out), "layout": self.layout, "dtype": self.dtype, "added": list(self.added),
            "renamed": self.renamed, "casts": list(self.casts), "head_identical": self.head_identical,
            "files": list(self.files), "nxd_hints": self.nxd_hints,
        }


def convert_eagle(
    draft: str | Path,
    target: str | Path,
    out: Path,
    *,
    dtype: str = "auto",
    overwrite_head: bool = False,
    reporter: Reporter | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> EagleResult:
    """Convert an EAGLE draft for NxDI into ``out`` (a new directory, published atomically).

    ``draft`` / ``target`` are local checkpoint directories or cached hub ids. ``dtype="auto"`` copies every draft
    tensor bit for bit and casts the added target tensors to the draft's dtype (the dtype of ``fc.weight``) when they
    differ; ``"float16"|"bfloat16"|"float32"`` casts every floating tensor. Every cast is reported and recorded.
    Raises ConversionError (nothing written) when the draft does not fit the target.

    Example::

        convert_eagle(Path("eagle-draft"), Path("llama-3-8b"), Path("eagle-nxd"), dtype="float16").casts
        # ({"name": "lm_head.weight", "from": "BF16", "to": "F16"},)
    """
    reporter = reporter or NullReporter()
    from neuronpack.checkpoint import resolve_model

    draft_dir, target_dir = resolve_model(draft, reporter=reporter), resolve_model(target, reporter=reporter)
    check_output_path(Path(out), inputs=[draft_dir, target_dir])  # fail fast; atomic_output_dir checks again
    draft_ckpt, target_ckpt = open_checkpoint(draft_dir), open_checkpoint(target_dir)
    plan = plan_eagle_conversion(draft_ckpt, target_ckpt, dtype=dtype, overwrite_head=overwrite_head)
    if overwrite_head and plan.layout == "eagle3":
        reporter.warn("--overwrite-head ignored: an EAGLE-3 draft keeps its own trained lm_head")
    _report_plan(plan, target_ckpt, reporter, implicit=dtype == "auto")
    with ThreadPoolExecutor(max_workers=2) as pool:
        # Hash the sources while the output streams: hashlib releases the GIL, so this overlaps with the writes.
        digests = pool.submit(_source_digests, draft_ckpt, target_ckpt, plan)
        # Import numpy and make the cast tables while the draft's tensors are copied (the kernel copies them, with
        # the GIL released): ~60 ms the first cast would otherwise wait for. Best effort: a failure shows in the cast.
        if plan.casts:
            pool.submit(warm_up, {(t.source_dtype, t.dtype) for t in plan.casts})
        with atomic_output_dir(Path(out), inputs=[draft_dir, target_dir], label="eagle-") as staging:
            stream = TensorStream(plan, draft_ckpt, target_ckpt)
            specs = [TensorSpec(t.name, t.dtype, t.shape) for t in plan.tensors]
            shards = write_safetensors_sharded(  # flush_behind: writeback overlaps the copy, not the fsync after it
                staging, specs, stream.chunks(), max_shard_bytes=max_shard_bytes, reporter=reporter, flush_behind=True
            )
            result = _finish(staging, Path(out), plan, stream, draft_ckpt, target_ckpt, shards, digests.result(),
                             sources={"draft": str(draft), "target": str(target), "dtype": dtype})
    if result.head_identical is not None:
        state = "identical to" if result.head_identical else "different from"
        reporter.info(f"replaced the draft's lm_head.weight: it was {state} the target's head")
    return result


def eagle_nxd_hints(out_dir: Path) -> dict:
    """The NeuronConfig hints NxDI needs for a converted draft (torch-free for safetensors drafts).

    Reads the ``neuronpack_eagle`` section that convert_eagle writes into config.json; a draft converted by other
    means is inspected from its tensor names instead (it must already contain ``lm_head.weight``).

    Example::

        eagle_nxd_hints(Path("eagle-nxd"))
        # {"enable_eagle_speculation": True, "enable_fused_speculation": True,
        #  "enable_eagle_draft_input_norm": False, "is_eagle3": False, "fc_bias": True}
    """
    ckpt = open_checkpoint(Path(out_dir))
    section = ckpt.config.get(CONFIG_SECTION)
    if isinstance(section, dict) and isinstance(section.get("nxd_hints"), dict):
        return dict(section["nxd_hints"])
    names = set(ckpt.names())
    if HEAD not in names:
        raise ConversionError(
            "the draft has no lm_head.weight, which NxDI needs inside an EAGLE draft",
            where=str(ckpt.root),
            fix="run: neuronpack convert-eagle --draft DRAFT --target TARGET --out DIR, and use DIR",
        )
    layout = detect_layout(sorted(names))
    return _hints(layout, fc_bias="fc.bias" in names, input_norm="layers.0.input_layernorm.weight" in names)


# --- config, manifest, report ---------------------------------------------------------------------------------------
def _hints(layout: str, *, fc_bias: bool, input_norm: bool) -> dict:
    return {
        "enable_eagle_speculation": True,
        "enable_fused_speculation": True,
        "enable_eagle_draft_input_norm": input_norm,
        "is_eagle3": layout == "eagle3",
        "fc_bias": fc_bias,
    }


def nxd_draft_config(config: dict, plan: EaglePlan, *, explicit_dtype: bool) -> dict:
    """The draft's config.json for NxDI: everything kept, plus ``fc_bias`` and a ``neuronpack_eagle`` section.

    Example::

        nxd_draft_config({"bias": True, "hidden_size": 4096}, plan, explicit_dtype=False)["fc_bias"]    # True
    """
    out = dict(config)
    out["fc_bias"] = plan.fc_bias  # NxDI reads fc_bias; EAGLE's own key is "bias" (kept as is)
    if explicit_dtype:
        out["torch_dtype"] = plan.out_dtype
        if "dtype" in out:  # transformers 5 writes "dtype"
            out["dtype"] = plan.out_dtype
    out[CONFIG_SECTION] = {
        "layout": plan.layout,
        "has_input_layernorm": plan.input_norm,
        "nxd_hints": _hints(plan.layout, fc_bias=plan.fc_bias, input_norm=plan.input_norm),
    }
    return out


def _finish(staging: Path, out: Path, plan: EaglePlan, stream: TensorStream, draft: Checkpoint,
            target: Checkpoint, shards: list[Path], digests: dict, *, sources: dict) -> EagleResult:
    """Write config.json, aux files and the manifest into staging; return the result (paths under ``out``)."""
    config = nxd_draft_config(draft.config, plan, explicit_dtype=sources["dtype"] != "auto")
    (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    aux = copy_aux_files(draft.root, staging)
    file_of = _output_file_of(staging, shards, plan)
    added = tuple(
        {"name": t.name, "from": t.source_name, "file": target.info(t.source_name).file.name, "dtype": t.dtype,
         "shape": list(t.shape), "stored_in": file_of[t.name]}
        for t in plan.added
    )
    casts = tuple({"name": t.name, "from": t.source_dtype, "to": t.dtype} for t in plan.casts)
    written = sorted([p.name for p in staging.iterdir()] + [MANIFEST])
    result = EagleResult(
        out=out.expanduser().absolute(), layout=plan.layout, dtype=plan.out_dtype, added=added,
        renamed=dict(plan.renamed), casts=casts, head_identical=stream.head_identical, files=tuple(written),
        nxd_hints=config[CONFIG_SECTION]["nxd_hints"],
    )
    manifest = {
        "schema": 1,
        "tool": f"neuronpack {__version__} convert-eagle",
        "layout": plan.layout,
        "dtype": {"requested": sources["dtype"], "output": plan.out_dtype},
        "draft": {"source": sources["draft"], "path": str(draft.root), "format": draft.format,
                  "files": digests["draft"]},
        "target": {"source": sources["target"], "path": str(target.root), "format": target.format,
                   "files": digests["target"]},
        "added": list(added),
        "renamed": dict(plan.renamed),
        "cast": list(casts),
        "replaced_head": None if stream.head_identical is None else {"identical": stream.head_identical},
        "aux_files": aux,
        "nxd_hints": result.nxd_hints,
        "outputs": _sizes(staging),
    }
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return result


def _output_file_of(staging: Path, shards: list[Path], plan: EaglePlan) -> dict[str, str]:
    """Output tensor name -> the shard file holding it."""
    index = staging / "model.safetensors.index.json"
    if index.is_file():
        return json.loads(index.read_text())["weight_map"]
    return {t.name: shards[0].name for t in plan.tensors}


def _sizes(staging: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(staging.iterdir()) if p.is_file()}


def _source_digests(draft: Checkpoint, target: Checkpoint, plan: EaglePlan) -> dict:
    """sha256 of every file read: the whole draft, and of the target only config, index and the shards read."""
    target_files = {target.info(t.source_name).file for t in plan.added}
    return {
        "draft": _digest_files(draft.root, [*_meta_files(draft.root), *draft.files]),
        "target": _digest_files(target.root, [*_meta_files(target.root), *sorted(target_files)]),
    }


def _meta_files(root: Path) -> list[Path]:
    names = ("config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json")
    return [root / n for n in names if (root / n).is_file()]


def _digest_files(root: Path, files: list[Path]) -> list[dict]:
    return [
        {"name": str(Path(f).relative_to(root)), "size": Path(f).stat().st_size, "sha256": file_sha256(Path(f))}
        for f in dict.fromkeys(files)
    ]


def _report_plan(plan: EaglePlan, target: Checkpoint, reporter: Reporter, *, implicit: bool) -> None:
    reporter.info(f"draft layout: {plan.layout} (hidden {plan.hidden_size}, vocabulary {plan.vocab_size})")
    for t in plan.added:
        source_file = target.info(t.source_name).file.name
        reporter.info(f"add {t.name} {list(t.shape)} from target {t.source_name} ({source_file})")
    if plan.renamed:
        reporter.info(f"rename {len(plan.renamed)} tensors midlayer.* -> layers.0.*")
    for t in plan.casts:
        message = f"cast {t.name} {t.source_dtype} -> {t.dtype}"
        if implicit:
            # The user did not ask for a cast: say why it happens and how to avoid it.
            reporter.warn(f"{message}: the target's dtype differs from the draft's "
                          f"{FLOAT_CODES[plan.out_dtype]} (--dtype auto keeps the draft's dtype; "
                          f"--dtype {FLOAT_DTYPES[t.source_dtype]} would write the whole draft in it)")
        else:
            reporter.info(message)
    if plan.layout == "eagle1" and not plan.input_norm:
        reporter.info("draft has no layers.0.input_layernorm (EAGLE-1/2): enable_eagle_draft_input_norm stays false")
    if EMBED in {t.name for t in plan.added} and plan.layout == "eagle1":
        reporter.info("draft had no embed_tokens.weight: added the target's")

