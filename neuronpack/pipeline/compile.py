"""`neuronpack compile` as a library call: a content-addressed, cached, atomic, concurrency-safe build.

Example::

    result = compile_model("./SmolLM2-135M-Instruct", recipe=Path("recipes/smollm2-135m-cpu.toml"))
    result.path        # <root>/neuron-compiled-artifacts/<key>
    result.cache_hit   # True the second time
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.artifacts.manifest_json import MANIFEST_NAME, complete_manifest_json
from neuronpack.artifacts.store import key_lock, new_staging, publish, record_failure
from neuronpack.errors import ArtifactError, BackendUnavailableError, BuildError, NeuronpackError
from neuronpack.fsutil import disk_full, remove_tree
from neuronpack.pipeline.inputs import resolve_inputs
from neuronpack.pipeline.plan import BuildPlan, plan_build
from neuronpack.progress import NullReporter, Reporter

if TYPE_CHECKING:
    from neuronpack.artifacts.donors import Donor
    from neuronpack.artifacts.manifest import Manifest
    from neuronpack.artifacts.remote import Transport
    from neuronpack.backends.base import GraphDonor

# A cache hit imports only what it runs: the remote store, derived checkpoints (quantize, EAGLE) and the backends'
# build code are imported inside the functions that use them; the recipe comes from the memo (recipe_memo) and the
# manifest is checked as JSON (artifacts.manifest_json), so a hit imports no pydantic either.


@dataclass
class CompileResult:
    path: Path
    key: str
    cache_hit: bool
    framework: str
    framework_reason: str
    manifest_json: dict[str, Any] | None = None  # the manifest as on disk; None for --dry-run
    compile_config: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    dry_run: bool = False
    accuracy: dict[str, Any] | None = None  # with check_accuracy: the AccuracyReport as a dict (also in the manifest)
    remote_hit: bool = False  # pulled from the remote store instead of building
    in_remote: bool | None = None  # --dry-run with a remote store: is the key there?
    pushed: dict[str, Any] | None = None  # --push: what push_artifact did
    graphs_from: dict[str, Any] | None = None  # a build that took a donor's graphs: the donor, seconds saved
    typed_manifest: Manifest | None = field(default=None, repr=False, compare=False)  # `manifest`, once read

    @property
    def manifest(self) -> Manifest | None:
        """The typed manifest (parsed from ``manifest_json`` on first use; a hit itself does not need it)."""
        if self.typed_manifest is None and self.manifest_json is not None:
            from neuronpack.artifacts.manifest import parse_manifest

            self.typed_manifest = parse_manifest(self.manifest_json, where=str(self.path / MANIFEST_NAME))
        return self.typed_manifest


def compile_model(
    model: str | None,
    *,
    recipe: Path | None = None,
    overrides: Sequence[str] = (),
    framework: str | None = None,
    out_root: Path | None = None,
    dest: Path | None = None,
    force: bool = False,
    dry_run: bool = False,
    check_accuracy: bool = False,
    reporter: Reporter | None = None,
    remote: Transport | None = None,
    push: bool = False,
    reuse: bool | None = None,
) -> CompileResult:
    """Compile MODEL with a recipe into ``<root>/neuron-compiled-artifacts/<key>/`` (or exactly ``dest``), or return
    the existing artifact for the same key. With ``remote``, a key missing locally is looked up there first (one
    request) and pulled on a hit; ``push`` publishes the artifact there afterwards. Raises NeuronpackError subclasses
    on bad input or a failed build.

    ``check_accuracy``: a new build is compared with the checkpoint (``neuronpack.accuracy``) in staging, before
    the manifest is written, and the figures are recorded in it under ``accuracy`` (results, not key inputs; a
    failing check still publishes: the caller decides, by ``result.accuracy["status"]``). A hit (local or pulled)
    returns the recorded figures, or runs the check on the artifact without modifying it.

    ``reuse``: on a miss, an artifact with the same graph key (same shapes, config, recipe, toolchain; other weight
    values), in the local store or else in ``remote``, donates its compiled graphs and only what depends on the
    weights is built (``CompileResult.graphs_from``); False compiles every graph. None (the default): reuse, except
    with ``force``: a forced rebuild is from scratch, every graph compiled here, unless ``reuse`` is True."""
    reporter = reporter or NullReporter()
    if push and remote is None:
        from neuronpack.artifacts.remote import REMOTE_ENV

        raise NeuronpackError("--push needs a remote store", where="--push",
                              fix=f"pass --remote s3://bucket/prefix (or set {REMOTE_ENV})")
    if reuse is None:
        reuse = not force
        if force:
            reporter.info("--force: every graph is compiled here (--reuse takes them from an artifact of the same "
                          "graph key)")
    result = _compile(model, recipe=recipe, overrides=overrides, framework=framework, out_root=out_root, dest=dest,
                      force=force, dry_run=dry_run, reporter=reporter, remote=remote, check_accuracy=check_accuracy,
                      reuse=reuse)
    if push and not dry_run and not result.remote_hit:
        from neuronpack.artifacts.remote.push import push_artifact

        if result.accuracy and result.accuracy["status"] == "failed":  # a gate: a failing artifact is not shared
            reporter.warn("not pushed: the accuracy check failed")
        else:
            result.pushed = push_artifact(result.path, remote, reporter=reporter).to_dict()
    return result


def _compile(model: str | None, *, recipe: Path | None, overrides: Sequence[str], framework: str | None,
             out_root: Path | None, dest: Path | None, force: bool, dry_run: bool, reporter: Reporter,
             remote: Transport | None, check_accuracy: bool, reuse: bool) -> CompileResult:
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    inputs = resolve_inputs(model, recipe_path=recipe, overrides=overrides, framework=framework, reporter=reporter)
    reporter.info(f"framework: {inputs.framework} ({inputs.framework_reason})")
    timings["resolve"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    plan = plan_build(inputs, out_root=out_root, dest=dest)
    timings["key"] = time.perf_counter() - t0
    final = plan.dest

    if dry_run:
        from neuronpack.artifacts.remote.pull import fetch_manifest

        in_remote = None if remote is None else fetch_manifest(remote, plan.key) is not None
        return CompileResult(final, plan.key, False, inputs.framework, inputs.framework_reason, None,
                             plan.for_build().compile_config(reporter), timings, dry_run=True, in_remote=in_remote)

    if not force and (data := complete_manifest_json(final, plan.key)) is not None:
        return _hit(plan, timings, data, check_accuracy, reporter)
    plan = plan.for_build()  # from here on the recipe is validated in full: a build never runs on the memo
    inputs = plan.inputs
    if not force and remote is not None and (pulled := _pull_hit(remote, plan, timings, reporter)):
        return _hit(plan, timings, pulled.to_json(), check_accuracy, reporter, remote_hit=True, typed=pulled)

    availability = inputs.backend.availability()
    if not availability.ok:
        raise BackendUnavailableError(
            f"framework {inputs.framework} cannot build here: {availability.reason}",
            fix="run on a machine with the Neuron SDK, use --framework torch, or --dry-run to see the configuration",
        )
    with key_lock(final.parent / ".locks", final.name,
                  on_wait=lambda: reporter.info("another build of this key is running; waiting for it")):
        if not force and (data := complete_manifest_json(final, plan.key)) is not None:
            return _hit(plan, timings, data, check_accuracy, reporter)
        donor = _find_donor(plan, remote, reporter) if reuse else None
        return _build(plan, timings, reporter, replace=final.exists(), check_accuracy=check_accuracy, donor=donor)


def _hit(plan: BuildPlan, timings: dict[str, float], data: dict[str, Any], check_accuracy: bool, reporter: Reporter,
         *, remote_hit: bool = False, typed: Manifest | None = None) -> CompileResult:
    result = CompileResult(plan.dest, plan.key, True, plan.inputs.framework, plan.inputs.framework_reason, data,
                           data.get("compile_config") or {}, timings, remote_hit=remote_hit, typed_manifest=typed)
    if check_accuracy:
        result.accuracy = data.get("accuracy")
        if result.accuracy is None:  # built without the check: run it now, leave the published artifact untouched
            result.accuracy = {**_accuracy(result.manifest, plan.dest, reporter), "recorded": False}
    return result


def _pull_hit(remote: Transport, plan: BuildPlan, timings: dict[str, float], reporter: Reporter) -> Manifest | None:
    """The manifest of the artifact pulled from the remote store, or None when the key is not there (one request)."""
    from neuronpack.artifacts.remote.pull import fetch_manifest, pull_artifact

    t0 = time.perf_counter()
    manifest = fetch_manifest(remote, plan.key)
    timings["remote_lookup"] = time.perf_counter() - t0
    if manifest is None:
        reporter.info(f"remote miss: {plan.key[:16]} is not in {remote.url}; building")
        return None
    reporter.info(f"remote hit: pulling {plan.key[:16]} from {remote.url}")
    timings["pull"] = pull_artifact(remote, plan.key, plan.dest, manifest=manifest, reporter=reporter).seconds
    return manifest


def _find_donor(plan: BuildPlan, remote: Transport | None, reporter: Reporter) -> Donor | None:
    """An artifact of this build's graph key, in the store it publishes to, else in ``remote``; None when there is
    none or the backend cannot take one here."""
    from neuronpack.artifacts.donors import find_local_donor

    backend = plan.inputs.backend
    problem = backend.graph_reuse_problem()
    if problem is not None:
        reporter.info(f"graph reuse off: {problem}")
        return None
    graph_key = plan.graph_key
    donor = find_local_donor([plan.dest.parent], graph_key, backend.graph_files, exclude=plan.key)
    if donor is None and remote is not None:
        from neuronpack.artifacts.remote.graph_index import find_remote_donor

        donor = find_remote_donor(remote, graph_key, backend.graph_files, exclude=plan.key)
    if donor is None:
        reporter.info(f"graph key {graph_key[:16]}: no artifact has it yet, compiling its graphs")
    else:
        reporter.info(f"graph key {graph_key[:16]}: reusing the compiled graphs of {donor.key[:16]} "
                      f"({donor.source}); only the weights are built")
    return donor


def _install_donor(donor: Donor, staging: Path, reporter: Reporter) -> GraphDonor | None:
    """The donor's graph files into ``staging``; None (staging emptied again) when one no longer matches its
    manifest: the build then compiles its own graphs."""
    from neuronpack.artifacts.donors import install_donor_files
    from neuronpack.backends.base import GraphDonor

    try:
        install_donor_files(donor, staging, reporter)
    except ArtifactError as exc:
        reporter.warn(f"not reusing {donor.key[:16]}: {exc.one_line()}")
        for path in list(staging.iterdir()):
            remove_tree(path) if path.is_dir() else path.unlink()
        return None
    return GraphDonor(key=donor.key, files=tuple(f["path"] for f in donor.files))


def _graphs_section(plan: BuildPlan, donor: Donor | None, graph_seconds: float | None, build_seconds: float):
    """The manifest's ``graphs``: the graph key, and the compile the graphs cost where first built (a donor's
    figure carries over; else what the backend timed, else its whole build), with the donor when there is one."""
    seconds = donor.seconds if donor else graph_seconds if graph_seconds is not None else build_seconds
    return {"key": plan.graph_key, "code": plan.graph_key_inputs["code"], "seconds": round(float(seconds), 3),
            "from": donor.record() if donor else None}


def _check_donor_files(manifest: Manifest, donor: Donor) -> None:
    """The build left the donor's graph files as they were (they may be hard links into the donor)."""
    built = {f.path: f.sha256 for f in manifest.files}
    for entry in donor.files:
        if built.get(entry["path"]) != entry["sha256"]:
            raise BuildError(f"the build changed the donor's graph file {entry['path']}", where=donor.source,
                             fix="run `neuronpack verify` on the donor, and compile with --no-reuse")


def _check_checkpoint(model_dir: Path) -> None:
    """What no backend may build silently: a tied head with another head stored (checkpoint/tied_head.py)."""
    from neuronpack.checkpoint import open_checkpoint
    from neuronpack.checkpoint.tied_head import check_tied_head

    check_tied_head(open_checkpoint(Path(model_dir)))


def _accuracy(manifest: Manifest, artifact_dir: Path, reporter: Reporter) -> dict[str, Any]:
    from neuronpack.accuracy import check_accuracy, subject_from_manifest

    record = check_accuracy(subject_from_manifest(manifest, artifact_dir), reporter=reporter).to_dict()
    record.pop("artifact")  # a staging path during a build; the manifest's own directory is the artifact
    return record


def _accuracy_before_compile(plan: BuildPlan, config: dict[str, Any], staging: Path,
                             reporter: Reporter) -> dict[str, Any]:
    from neuronpack.accuracy.before_compile import check_before_compile
    from neuronpack.accuracy.check import subject_of

    inputs = plan.inputs
    subject = subject_of(staging, inputs.framework, config, inputs.recipe, plan.model_info().config,
                         Path(inputs.model_dir), inputs.backend.target(inputs.recipe).get("instance"),
                         neuron_config=config["neuron_config"])
    return check_before_compile(subject, reporter)


def _build(plan: BuildPlan, timings: dict[str, float], reporter: Reporter, *, replace: bool,
           check_accuracy: bool, donor: Donor | None = None) -> CompileResult:
    from neuronpack.artifacts.manifest import build_manifest, write_manifest
    from neuronpack.pipeline.prepare import ensure_eagle_draft, ensure_quantized

    inputs, key, final = plan.inputs, plan.key, plan.dest
    _check_checkpoint(inputs.model_dir)
    staging = new_staging(final.parent, key)
    try:
        graph_donor = None
        if donor is not None:
            t0 = time.perf_counter()
            graph_donor = _install_donor(donor, staging, reporter)
            donor = donor if graph_donor else None
            timings["graphs_reused"] = time.perf_counter() - t0
        if plan.prequantize:
            t0 = time.perf_counter()
            ensure_quantized(plan.model_dir, inputs.model_dir, inputs.recipe.quantization, reporter)
            timings["quantize"] = time.perf_counter() - t0
        if plan.convert_draft:
            ensure_eagle_draft(plan.draft_dir, inputs.draft_dir, inputs.model_dir, reporter)
        request = plan.request(staging, reporter, graph_donor)
        config = inputs.backend.compile_config(request)
        before = None
        if check_accuracy and inputs.backend.checks_accuracy_before_compile:  # a bad checkpoint fails before neuronx-cc
            t0 = time.perf_counter()
            before = _accuracy_before_compile(plan, config, staging, reporter)
            timings["accuracy"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        extras = inputs.backend.build(request) or {}
        timings["build"] = time.perf_counter() - t0
        graph_seconds = extras.pop("graph_seconds", None)  # the graphs' share of the build: graphs.seconds
        t0 = time.perf_counter()
        manifest = build_manifest(
            key=key,
            key_inputs=plan.key_inputs,
            recipe=inputs.recipe,
            plan=inputs.plan,
            model=plan.model_info(),
            compile_config=config,
            serve=plan.serve_hints(),
            timings=timings,
            extras={**extras, "framework_reason": inputs.framework_reason},
            root=staging,
            graphs=_graphs_section(plan, donor, graph_seconds, timings["build"]),
        )
        timings["manifest"] = time.perf_counter() - t0
        if donor is not None:
            _check_donor_files(manifest, donor)
        if before is not None:
            manifest = manifest.model_copy(update={"accuracy": {**before, "recorded": True}})
        elif check_accuracy:  # after the file list, before the manifest exists: the check writes nothing here
            t0 = time.perf_counter()
            accuracy = {**_accuracy(manifest, staging, reporter), "recorded": True}
            timings["accuracy"] = time.perf_counter() - t0
            manifest = manifest.model_copy(update={"accuracy": accuracy})
        manifest = manifest.model_copy(update={"timings": {k: round(v, 3) for k, v in timings.items()}})
        write_manifest(staging, manifest)  # last: only now can the directory load as valid
        publish(staging, final, replace=replace, framework=inputs.backend.name)
    except NeuronpackError as exc:
        remove_tree(staging)
        record_failure(final.parent, key, exc.one_line(), traceback.format_exc())
        raise
    except BaseException as exc:
        remove_tree(staging)
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        log = record_failure(final.parent, key, repr(exc), traceback.format_exc())
        if disk_full(exc):
            raise BuildError("no space left on device while building the artifact", where=str(final.parent),
                             fix="free space there (`neuronpack gc --keep N` removes old artifacts) or choose "
                             "another --out-root") from exc
        raise BuildError(f"{inputs.framework} build failed: {type(exc).__name__}: {exc}",
                         where=str(log) if log else str(final.parent),
                         fix="read the log; rerun with NEURONPACK_DEBUG=1 for a traceback") from exc
    graphs_from = None
    if donor is not None:
        graphs_from = {**donor.record(), "compile_seconds_saved": round(donor.seconds, 3)}
    return CompileResult(final, key, False, inputs.framework, inputs.framework_reason, manifest.to_json(), config,
                         timings, accuracy=manifest.accuracy, typed_manifest=manifest, graphs_from=graphs_from)
