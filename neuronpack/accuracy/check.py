"""Run an artifact and its reference checkpoint on the same prompts, teacher-forced, and judge the agreement.

For each prompt the reference (transformers, float32, the artifact's own tokenizer files) first generates a greedy
continuation; then both sides score prompt + continuation teacher-forced: the reference in one forward pass, the
artifact through its serving path (``prompt_logits``: one context-graph pass, then one token-generation step per
continuation token). ``metrics.py`` turns the two logits tensors into figures; the thresholds of the artifact's
precision decide pass or fail.

Portable (torch) artifacts run through their runtime. NxDI artifacts run, where NxD Inference imports (a Neuron
build box; no device needed), through NxDI's own modeling code on the CPU at tp 1 (``nxdi_cpu.py``: the recorded
NeuronConfig and checkpoint, the quantized one for a quantized recipe), scored teacher-forced one context pass per
prefix; a quantized artifact is also compared with the reference on its dequantized weights (``vs_dequantized``: a
format bug is far off there, quantization error is not). Elsewhere, and for transformers-neuronx, the status is
``not_run`` and ``plan`` says what would run and on what hardware; also when the weights would not fit this
machine's free memory.

The reference and how transformers reads it are reference.py's rule (a ``neuronpack quantize``d checkpoint: the
checkpoint it was quantized from, else itself dequantized); the thresholds are those of the artifact's weights: the
recipe's quantization, else the quantized checkpoint's own (int8 / fp8), else the compute dtype.

Example::

    subject = subject_from_manifest(read_manifest(artifact_dir), artifact_dir)
    report = check_accuracy(subject)          # AccuracyReport
    report.status, report.summary["top1_agreement"], report.failures
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.accuracy.metrics import THRESHOLDS, PromptStats, Thresholds, compare_logits, precision_class, summarize
from neuronpack.accuracy.prompts import DEFAULT_PROMPTS, EvalPrompt, encode_prompt
from neuronpack.accuracy.reference import Reference, load_reference, resolve_reference
from neuronpack.errors import AccuracyError
from neuronpack.progress import NullReporter, Reporter

if TYPE_CHECKING:
    from neuronpack.artifacts.manifest import Manifest

DEFAULT_NEW_TOKENS = 32
PASSED, FAILED, NOT_RUN = "passed", "failed", "not_run"


@dataclass(frozen=True)
class Subject:
    """What to check: the artifact, how it was built, and the checkpoint it must agree with."""

    artifact_dir: Path
    framework: str
    precision: str  # a THRESHOLDS key: float32 / bfloat16 / float16 / int8 / fp8
    reference_dir: Path | None
    instance: str | None = None
    # nxd: the NeuronConfig kwargs to run (None: the artifact manifest's); given before the build (before_compile.py)
    neuron_config: dict[str, Any] | None = None
    draft_dir: Path | None = None  # nxd fused speculation: the converted EAGLE draft (loaded, not run: no CPU forward)
    model_class: str | None = None  # nxd: the NxDI application class the artifact was compiled with
    model_dir: Path | None = None  # the checkpoint the build read, as given (NxDI's model path); None: reference_dir
    reference_dequantized: bool = False  # reference_dir is a neuronpack-quantized checkpoint, read dequantized

    @property
    def reference(self) -> Reference:
        return Reference(self.reference_dir, self.reference_dequantized)


@dataclass(frozen=True)
class AccuracyReport:
    status: str  # passed / failed / not_run
    subject: Subject
    thresholds: Thresholds
    new_tokens: int
    summary: dict[str, Any] | None = None
    prompts: tuple[PromptStats, ...] = ()
    failures: tuple[str, ...] = ()
    plan: tuple[str, ...] = ()
    reason: str | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; what ``eval --format json`` prints and ``compile --check-accuracy`` records in the manifest."""
        return {
            "status": self.status,
            "artifact": str(self.subject.artifact_dir),
            "framework": self.subject.framework,
            "precision": self.subject.precision,
            "reference": str(self.subject.reference_dir) if self.subject.reference_dir else None,
            "reference_dequantized": self.subject.reference_dequantized,
            "thresholds": self.thresholds.to_dict(),
            "new_tokens": self.new_tokens,
            "summary": self.summary,
            "prompts": [p.to_dict() for p in self.prompts],
            "failures": list(self.failures),
            "plan": list(self.plan),
            "reason": self.reason,
            "seconds": round(self.seconds, 2),
        }


def subject_from_manifest(manifest: Manifest, artifact_dir: Path, reference: Path | None = None) -> Subject:
    """The Subject of an artifact: precision from its compile config (the resolved dtype), recipe (quantization) and
    checkpoint (already quantized); reference by reference.py's rule from the checkpoint it was compiled from
    (before the recipe's quantization), unless ``reference`` is given."""
    source = manifest.model.original_path or manifest.model.path
    return subject_of(artifact_dir, manifest.framework, manifest.compile_config, manifest.recipe,
                      manifest.model.config, Path(source) if source else None, manifest.target.get("instance"),
                      reference=reference)


def subject_of(artifact_dir: Path, framework: str, compile_config: dict[str, Any], recipe, model_config: dict,
               source: Path | None, instance: str | None, *, neuron_config: dict | None = None,
               reference: Path | None = None) -> Subject:
    """The Subject of a build of ``source`` (the checkpoint as given) from its compile config and recipe: precision =
    the weights' quantization (the recipe's, else the checkpoint's own int8 / fp8) or the resolved dtype (``auto``:
    the checkpoint's own); the reference by reference.py's rule (``reference``: the user's choice)."""
    from neuronpack.artifacts.precision import checkpoint_precision

    stored = checkpoint_precision(model_config)
    quant = (recipe.quantization.dtype if recipe.quantization else
             stored.dtype if stored is not None and stored.dtype in THRESHOLDS else None)
    config = compile_config
    dtype = config.get("torch_dtype") or (config.get("neuron_config") or {}).get("torch_dtype") or recipe.model.dtype
    if dtype == "auto":  # the checkpoint's own dtype
        dtype = model_config.get("torch_dtype") or model_config.get("dtype") or "float32"
    draft = (config.get("draft") or {}).get("path")
    resolved = resolve_reference(reference or source, given=reference is not None)
    return Subject(Path(artifact_dir), framework, precision_class(str(dtype), quant), resolved.path, instance,
                   neuron_config, Path(draft) if draft else None, config.get("model_class"),
                   model_dir=None if source is None else Path(source), reference_dequantized=resolved.dequantized)


def check_accuracy(
    subject: Subject,
    *,
    prompts: Sequence[EvalPrompt] | None = None,
    new_tokens: int = DEFAULT_NEW_TOKENS,
    thresholds: Thresholds | None = None,
    reporter: Reporter | None = None,
) -> AccuracyReport:
    """Score ``prompts`` (default: DEFAULT_PROMPTS) on the artifact and the reference; AccuracyError when the check
    cannot run (missing reference, mismatched vocabulary, empty prompt)."""
    import time

    reporter = reporter or NullReporter()
    limits = thresholds or THRESHOLDS.get(subject.precision)
    if limits is None:
        raise AccuracyError(f"no accuracy thresholds for precision {subject.precision!r}",
                            where=str(subject.artifact_dir), fix=f"use one of {', '.join(THRESHOLDS)}")
    started = time.perf_counter()
    plan: tuple[str, ...] = ()
    if subject.framework == "torch":
        stats = _score_torch(subject, prompts, new_tokens, reporter)
        summary = summarize(stats)
    else:
        check_nxd_quantization(subject)
        not_run = nxd_cpu_refusal(subject)
        if not_run:
            return AccuracyReport(NOT_RUN, subject, limits, new_tokens, reason=not_run,
                                  plan=neuron_plan(subject, prompts, new_tokens, limits))
        stats, summary, plan = _score_nxd_cpu(subject, prompts, new_tokens, reporter)
    failures = tuple(limits.failures(summary))
    return AccuracyReport(FAILED if failures else PASSED, subject, limits, new_tokens, summary, tuple(stats),
                          failures, plan=plan, seconds=time.perf_counter() - started)


def check_nxd_quantization(subject: Subject) -> None:
    """An nxd artifact of a ``neuronpack quantize``d checkpoint must tell NxD Inference so (``quantized`` in its
    NeuronConfig): otherwise NxDI loads the int8 / fp8 values as floats and drops every scale, on the device as on
    this CPU. Known without running anything: AccuracyError."""
    from neuronpack.accuracy.reference import quantized_by_neuronpack

    source = subject.model_dir or subject.reference_dir
    if subject.framework != "nxd" or source is None or not quantized_by_neuronpack(source):
        return
    if not _recorded(subject).get("quantized"):
        raise AccuracyError("the checkpoint holds quantized weights and scales (neuronpack quantize) but the "
                            "artifact's NeuronConfig has quantized: false, so NxD Inference reads the quantized values "
                            "as floats and drops the scales", where=str(source),
                            fix="compile the float checkpoint with a [quantization] section in the recipe (it "
                                "quantizes in NxD Inference's format and sets the NeuronConfig)")


def nxd_cpu_refusal(subject: Subject) -> str | None:
    """Why an NxDI / TNx artifact cannot be checked on this machine's CPU, or None when it can."""
    import psutil

    from neuronpack.accuracy import nxdi_cpu

    if subject.framework != "nxd":
        return f"{subject.framework} artifacts run only on a Neuron device"
    if not nxdi_cpu.nxdi_importable():
        return "needs NxD Inference (neuronx-distributed-inference) importable: its CPU path checks nxd artifacts"
    limit = nxdi_cpu.upstream_limit(_recorded(subject), subject.model_class)
    if limit:
        return limit
    ref = subject.reference_dir
    weights = sum(p.stat().st_size for p in ref.glob("*.safetensors")) if ref is not None and ref.is_dir() else 0
    # NxDI's model, the state dict it loads and the float32 reference live at once: about three copies
    need, free = 3 * weights, psutil.virtual_memory().available
    if need > free:
        return (f"the model needs ~{need / 2**30:.1f} GiB to check on the CPU and {free / 2**30:.1f} GiB is free: "
                "skipped rather than swap")
    return None


def _score_nxd_cpu(subject: Subject, prompts: Sequence[EvalPrompt] | None, new_tokens: int, reporter: Reporter):
    """(stats, summary, plan) of an nxd artifact run through NxDI's CPU path; a quantized one also against the
    reference on its dequantized weights (summary["vs_dequantized"])."""
    import torch

    from neuronpack.accuracy import nxdi_cpu

    recorded = _recorded(subject)
    tokenizer = _tokenizer(subject)
    encoded = [(prompt, _encoded(prompt, tokenizer)) for prompt in _usable_prompts(prompts, tokenizer)]
    seq_len = max(len(ids) for _, ids in encoded) + new_tokens + 1
    nxdi_cpu.init_cpu_process_group()
    dtype = str(recorded.get("torch_dtype", "float32"))
    draft = ()
    model_dir = str(subject.model_dir or subject.reference_dir)  # what the build read; the reference may differ
    if recorded.get("enable_fused_speculation") and subject.draft_dir is not None:
        loaded = nxdi_cpu.load_fused_spec_on_cpu(model_dir, recorded, str(subject.draft_dir),
                                                 dtype=dtype, seq_len=seq_len, model_class=subject.model_class)
        draft = (f"NeuronFusedSpecModel loaded {loaded['draft_model']} draft_model.* and {loaded['target_model']} "
                 f"target_model.* weights with their shapes from {subject.draft_dir}; the speculation forward was "
                 "not run (upstream has none on the CPU): the target model is scored alone",)
    app, _ = nxdi_cpu.load_on_cpu(model_dir, recorded, dtype=dtype, seq_len=seq_len, model_class=subject.model_class)
    reference = load_reference(subject.reference, app.config.vocab_size)
    quantized = recorded.get("quantized_checkpoints_path") if recorded.get("quantized") else None
    # in the dtype NxDI ran: what is left against it is kernel rounding, not quantization (a reference read
    # dequantized already is that row)
    dequantized = (nxdi_cpu.dequantized_reference(reference, quantized).to(getattr(torch, dtype))
                   if quantized and not subject.reference_dequantized else None)
    stats, against_dequantized = [], []
    with reporter.task(f"score {len(encoded)} prompts (NxDI on CPU vs reference)", total=len(encoded)) as task, \
            torch.inference_mode():
        for prompt, ids in encoded:
            continuation = _greedy(reference, ids, new_tokens)
            tokens = ids + continuation[:-1]
            actual = nxdi_cpu.prefix_logits(app, tokens, len(ids))
            # rows from the last prompt position on: context encoding returns only the last position's logits
            for model, into in ((reference, stats), (dequantized, against_dequantized)):
                if model is not None:
                    expected = model(torch.tensor([tokens])).logits[0, len(ids) - 1:].float()
                    scored = compare_logits(expected, actual, continuation, prompt_len=1, name=prompt.name)
                    into.append(replace(scored, prompt_tokens=len(ids)))  # scored from the last prompt position
            task.advance()
    summary = summarize(stats)
    if against_dequantized:
        summary["vs_dequantized"] = summarize(against_dequantized)
    tp = recorded.get("tp_degree", 1)
    plan = (f"ran NxD Inference's own modeling code on this CPU at tp 1, batch 1 (the recipe: tp {tp}, batch "
            f"{recorded.get('batch_size', 1)}); neuronx-cc, the device and the token-generation graph were not run",
            *draft)
    return stats, summary, plan


def _recorded(subject: Subject) -> dict[str, Any]:
    """The NeuronConfig kwargs to run: the subject's, else those the artifact's manifest recorded."""
    from neuronpack.artifacts.manifest import read_manifest

    if subject.neuron_config is not None:
        return dict(subject.neuron_config)
    return dict(read_manifest(subject.artifact_dir).compile_config.get("neuron_config") or {})


def _tokenizer(subject: Subject):
    """The artifact's tokenizer (else the reference's). NxDI pins transformers 4.57, which cannot name a tokenizer
    class that transformers 5 saved ("TokenizersBackend"): then tokenizer.json and the chat template directly."""
    import transformers

    for where in (subject.artifact_dir, subject.reference_dir):
        if where is None or not (Path(where) / "tokenizer_config.json").is_file():
            continue
        try:
            return transformers.AutoTokenizer.from_pretrained(where)
        except ValueError:
            if not (Path(where) / "tokenizer.json").is_file():
                raise
        fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(Path(where) / "tokenizer.json"))
        template = Path(where) / "chat_template.jinja"
        fast.chat_template = template.read_text() if template.is_file() else None
        return fast
    raise AccuracyError("no tokenizer in the artifact or the reference checkpoint", where=str(subject.artifact_dir),
                        fix="pass --reference DIR (the checkpoint the artifact was compiled from)")


def _encoded(prompt: EvalPrompt, tokenizer) -> list[int]:
    ids = encode_prompt(prompt, tokenizer)
    if not ids:
        raise AccuracyError(f"prompt {prompt.name!r} encodes to no tokens", where=prompt.name, fix="give it some text")
    return ids


def _usable_prompts(prompts: Sequence[EvalPrompt] | None, tokenizer) -> list[EvalPrompt]:
    """The prompts given, or the defaults this tokenizer can encode (the chat one needs a chat template)."""
    if prompts is not None:
        return list(prompts)
    return [p for p in DEFAULT_PROMPTS if p.messages is None or tokenizer.chat_template]


def neuron_plan(subject: Subject, prompts: Sequence[EvalPrompt] | None, new_tokens: int,
                limits: Thresholds) -> tuple[str, ...]:
    """What a check of a Neuron (nxd / tnx / vneuron) artifact would run, step by step (nothing here runs it)."""
    count = len(prompts if prompts is not None else DEFAULT_PROMPTS)
    stack = {"nxd": "neuronx-distributed-inference", "tnx": "transformers-neuronx",
             "vneuron": "vllm-neuron 0.21 / 0.24, the SDK 2.31+ vLLM Neuron plugin"}.get(subject.framework, "")
    load = (f"start vLLM with {subject.artifact_dir}/compile_cache as the plugin's remote cache (`neuronpack serve`), "
            "logprobs returned for every position" if subject.framework == "vneuron" else
            f"load {subject.artifact_dir} with NEURON_COMPILED_ARTIFACTS set to it, logits returned for every position "
            "(on-device sampling off)")
    return (
        f"hardware: a Neuron instance ({subject.instance or 'the recipe target'}) with the Neuron SDK ({stack})",
        load,
        f"score {count} prompts teacher-forced (prompt + {new_tokens} greedy reference tokens each)",
        f"reference: transformers float32 on CPU from {subject.reference.describe()}",
        f"gate ({subject.precision}): {limits.to_dict()}",
    )


def _score_torch(subject: Subject, prompts: Sequence[EvalPrompt] | None, new_tokens: int,
                 reporter: Reporter) -> list[PromptStats]:
    import torch
    import transformers

    from neuronpack.backends.torch_aot import load_artifact

    tokenizer = transformers.AutoTokenizer.from_pretrained(subject.artifact_dir)
    prompts = _usable_prompts(prompts, tokenizer)
    lm = load_artifact(subject.artifact_dir, reporter=reporter)
    reference = load_reference(subject.reference, lm.vocab_size)
    stats = []
    with reporter.task(f"score {len(prompts)} prompts (artifact vs reference)", total=len(prompts)) as task, \
            torch.inference_mode():
        for prompt in prompts:
            ids = _encoded(prompt, tokenizer)
            truncated = len(ids) > lm.context_buckets[-1]
            ids = ids[: lm.context_buckets[-1]]
            count = min(new_tokens, lm.max_seq_len - len(ids) + 1)  # decode positions stay below max_seq_len
            continuation = _greedy(reference, ids, count)
            expected = reference(torch.tensor([ids + continuation[:-1]])).logits[0]
            actual = _artifact_logits(lm, ids, continuation)
            stats.append(compare_logits(expected, actual, continuation, prompt_len=len(ids), name=prompt.name,
                                        truncated=truncated))
            task.advance()
    return stats


def _greedy(model, ids: list[int], count: int) -> list[int]:
    """The reference's greedy continuation of exactly ``count`` tokens (EOS does not stop it)."""
    import torch
    import transformers

    if count <= 0:
        return []
    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=count, min_new_tokens=count,
                                           eos_token_id=None, pad_token_id=0)
    model.generation_config.eos_token_id = None  # else generate() fills the config's None from the model's
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         generation_config=config)
    return out[0, len(ids):].tolist()


def _artifact_logits(lm, ids: list[int], continuation: list[int]):
    """The artifact's teacher-forced logits [len(ids) + len(continuation) - 1, vocab] through its serving path:
    one context pass for the prompt, then one token-generation step per continuation token (slot 0)."""
    import torch

    rows = [lm.prompt_logits(ids, slot=0)]
    tokens = torch.zeros(lm.batch_size, dtype=torch.long)  # idle slots write only their own row, at position 0
    positions = torch.zeros(lm.batch_size, dtype=torch.long)
    for offset, token in enumerate(continuation[:-1]):
        tokens[0], positions[0] = token, len(ids) + offset
        rows.append(lm.decode(tokens, positions)[:1])
    return torch.cat(rows, dim=0)


def with_thresholds(base: Thresholds, **overrides: Any) -> Thresholds:
    """``base`` with the given limits replaced (None values are ignored): the CLI's --min-top1, --max-kl-mean and
    --max-kl."""
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
