"""`neuronpack generate`: one completion from a torch artifact, through the serving engine (the text to stdout).

Example: ``neuronpack generate ART --chat --prompt "What is the capital of France?" --max-tokens 48``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from neuronpack.cli._console import OutputFormat, RichReporter, print_result
from neuronpack.cli._options import FormatOpt, QuietOpt
from neuronpack.errors import ServeError


def generate_command(
    artifact_dir: Annotated[Path, typer.Argument(help="compiled artifact directory (torch framework)")],
    *,
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="prompt text (the user message with --chat)")],
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="most tokens to generate")] = 64,
    temperature: Annotated[
        float, typer.Option("--temperature", min=0.0, help="0 = greedy (the default here)")
    ] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", help="sample among the k best (< 1: global_topk)")] = -1,
    top_p: Annotated[float, typer.Option("--top-p", min=0.0, max=1.0, help="nucleus mass")] = 1.0,
    seed: Annotated[int | None, typer.Option("--seed", help="seed for reproducible sampling")] = None,
    stop: Annotated[list[str] | None, typer.Option("--stop", help="stop string (repeatable)")] = None,
    chat: Annotated[bool, typer.Option("--chat", help="wrap the prompt with the model's chat template")] = False,
    lora: Annotated[
        str | None, typer.Option("--lora", help="apply this LoRA adapter of the artifact (a name in its \\[lora])")
    ] = None,
    threads: Annotated[int | None, typer.Option("--threads", min=1, help="torch CPU threads")] = None,
    speculation: Annotated[bool, typer.Option(
        "--speculation/--no-speculation",
        help="speculate when the artifact was compiled with \\[speculation] (--no-speculation: one token per step)",
    )] = True,
    output_format: FormatOpt = OutputFormat.text,
    quiet: QuietOpt = False,
) -> None:
    """Generate one completion from an artifact through the serving engine; the text goes to stdout."""
    from neuronpack.pipeline import resolve_serving_artifact
    from neuronpack.runtime.engine import GenerationRequest
    from neuronpack.runtime.engine.sampling import SamplingParams
    from neuronpack.runtime.loader import load_engine

    reporter = RichReporter(quiet=quiet)
    path = resolve_serving_artifact(artifact_dir, reporter=reporter)
    _check_adapter(path, lora)  # before loading: an unknown name is refused in a moment, not after the load
    loaded = load_engine(path, num_threads=threads, reporter=reporter, speculation=speculation)
    adapter = loaded.served_models().adapter_slot(lora) if lora is not None else 0
    tokenizer = loaded.engine.tokenizer
    ids = tokenizer.encode_chat([{"role": "user", "content": prompt}]) if chat else tokenizer.encode(prompt)
    request = GenerationRequest(
        prompt_ids=tuple(ids),
        sampling=SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed),
        max_tokens=max_tokens,
        stop=tuple(stop or ()),
        adapter=adapter,
    )
    result = loaded.engine.generate(request)
    timings = {"load_s": round(loaded.load_seconds, 4), **{k: round(v, 4) for k, v in result.timings.items()}}
    data = {"text": result.text, "tokens": result.token_ids, "finish_reason": result.finish_reason,
            "prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "model": lora or loaded.served_model_name, "timings": timings}
    if result.speculation is not None:  # its ratios rounded as the timings are
        data["speculation"] = {"kind": loaded.engine.speculation.kind,
                               **{k: round(v, 4) if isinstance(v, float) else v for k, v in result.speculation.items()}}
    print_result(output_format, data, result.text)
    if output_format is OutputFormat.json:
        return
    spec = result.speculation
    accepted = (f", {spec['tokens_per_step']:.2f} tokens/step, acceptance {spec['acceptance_rate'] or 0:.0%}"
                if spec and spec["tokens_per_step"] else "")
    reporter.info(f"[{result.completion_tokens} tokens, finish_reason={result.finish_reason}, "
                  f"{result.timings['tokens_per_s']:.1f} tokens/s{accepted}, load {loaded.load_seconds:.1f} s]")


def _check_adapter(path: Path, lora: str | None) -> None:
    """--lora NAME must name one of the artifact's adapters (its manifest's LoRA modules)."""
    if lora is None:
        return
    from neuronpack.artifacts.manifest import read_manifest

    names = [module.name for module in read_manifest(path).serve.lora_modules]
    if lora not in names:
        raise ServeError(f"no LoRA adapter {lora!r} in this artifact", where=str(path),
                         fix=f"pass one of: {', '.join(names)}" if names else
                         "this artifact was compiled without [lora] (see docs/lora.md)")
