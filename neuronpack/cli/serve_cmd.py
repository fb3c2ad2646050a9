"""`neuronpack serve` (OpenAI-compatible server) and `neuronpack generate` (one completion), both from an artifact.

torch artifacts run on the built-in runtime (neuronpack.runtime); nxd / tnx artifacts are served by vLLM, started with
the arguments the artifact was compiled with (``--print-command`` shows that command instead of running it).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NamedTuple

import typer

from neuronpack.cli._console import OutputFormat, RichReporter, print_result, stderr
from neuronpack.cli._options import EndpointOpt, FormatOpt, QuietOpt, RootOpt, SetOpt, check_plain_text
from neuronpack.errors import ServeError
from neuronpack.runtime.limits import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_WAITING,
    DEFAULT_PREFIX_CACHE_MIB,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_SHUTDOWN_GRACE,
)

if TYPE_CHECKING:
    from neuronpack.artifacts.manifest import Manifest


def serve_command(
    artifact_dir: Annotated[
        str | None,
        typer.Argument(help="compiled artifact directory, or a remote one (s3://bucket/prefix/<key>, "
                       "file:///path/<key>) to pull into the local root first (default: $NEURON_COMPILED_ARTIFACTS)"),
    ] = None,
    *,
    host: Annotated[str, typer.Option("--host", help="address to bind (loopback unless told otherwise)")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="TCP port")] = 8000,
    api_key: Annotated[
        str | None,
        typer.Option("--api-key", envvar="NEURONPACK_API_KEY", help="require 'Authorization: Bearer KEY' on /v1"),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", callback=check_plain_text,
                                  help="model to compile into $NEURON_COMPILED_ARTIFACTS when it is invalid")
    ] = None,
    recipe: Annotated[Path | None, typer.Option("--recipe", "-r", help="recipe for that compile")] = None,
    set_: SetOpt = None,
    served_model_name: Annotated[
        str | None, typer.Option("--served-model-name", callback=check_plain_text,
                                  help="the name clients send as 'model'")
    ] = None,
    print_command: Annotated[
        bool, typer.Option("--print-command", help="print the server command line and environment, then exit")
    ] = False,
    weights: Annotated[
        str | None, typer.Option("--weights", help="vneuron artifacts: where vLLM loads the weights on this machine "
                                                   "(a checkpoint directory, checked against the compiled one, or a "
                                                   "hub id; default: the model the artifact was compiled from)")
    ] = None,
    vllm_target: Annotated[
        str, typer.Option("--vllm-target", help="nxd/tnx artifacts: auto (from installed vllm / vllm-neuron), "
                                                "vllm-v0 (vLLM 0.9), vllm-v0-fork (AWS fork 2.24.0) or vllm-neuron "
                                                "(V1 plugin 0.4/0.5)")
    ] = "auto",
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="torch CPU threads (default: every core available)")
    ] = None,
    tool_call_parser: Annotated[
        str | None, typer.Option("--tool-call-parser",
                                 help="tool_choice auto: nxd/tnx artifacts pass vLLM --enable-auto-tool-choice "
                                      "--tool-call-parser NAME (checked against that vLLM's parsers); torch "
                                      "artifacts parse hermes (the only name they take)")
    ] = None,
    structured_outputs: Annotated[
        bool, typer.Option("--structured-outputs",
                           help="nxd/tnx artifacts: refuse to start where vLLM's Neuron worker cannot enforce "
                                "response_format / guided_* on this artifact (on-device sampling) instead of noting "
                                "it; torch artifacts always enforce them")
    ] = False,
    root: RootOpt = None,
    endpoint_url: EndpointOpt = None,
    max_body_bytes: Annotated[
        int, typer.Option("--max-body-bytes", min=1, help="largest request body; a larger one gets 413")
    ] = DEFAULT_MAX_BODY_BYTES,
    max_waiting: Annotated[
        int, typer.Option("--max-waiting", min=0,
                          help="requests that may wait for a batch slot; one more gets 503 with Retry-After")
    ] = DEFAULT_MAX_WAITING,
    request_timeout: Annotated[
        float, typer.Option("--request-timeout", min=0.0,
                            help="seconds a request may take (queue + generation) before it ends; 0: no limit")
    ] = DEFAULT_REQUEST_TIMEOUT,
    shutdown_grace: Annotated[
        float, typer.Option("--shutdown-grace", min=0.0,
                            help="on SIGTERM, seconds in-flight requests get to finish before they are ended")
    ] = DEFAULT_SHUTDOWN_GRACE,
    max_prefill_tokens: Annotated[
        int | None, typer.Option("--max-prefill-tokens", min=1,
                                 help="torch artifacts: token positions (prompts x the longest) of the one prefill "
                                      "call between two decode steps (default: the artifact's largest prompt)")
    ] = None,
    enable_prefix_caching: Annotated[
        bool, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching",
                           help="torch artifacts: reuse the KV of prompt prefixes seen before (vLLM's automatic "
                                "prefix caching; off: every prompt is prefilled whole)")
    ] = True,
    prefix_cache_memory: Annotated[
        float, typer.Option("--prefix-cache-memory", min=0.0,
                            help="torch artifacts: MiB of KV-cache rows added to keep cached prefixes in, beyond "
                                 "the batch's own free rows (0: those only)")
    ] = DEFAULT_PREFIX_CACHE_MIB,
    output_format: FormatOpt = OutputFormat.text,
    quiet: QuietOpt = False,
) -> None:
    """Serve an artifact over an OpenAI-compatible HTTP API (built-in runtime for torch artifacts, vLLM for Neuron)."""
    from neuronpack.artifacts.manifest import read_manifest
    from neuronpack.pipeline import resolve_serving_artifact

    reporter = RichReporter(quiet=quiet)
    path = resolve_serving_artifact(artifact_dir, model=model, recipe=recipe, overrides=set_ or [], reporter=reporter,
                                    root=root, endpoint_url=endpoint_url)
    manifest = read_manifest(path)
    if served_model_name:
        manifest = manifest.with_serve(served_model_name=served_model_name)
    if weights is not None and manifest.framework != "vneuron":
        raise ServeError("--weights applies to vneuron artifacts (the others carry or record their weights)",
                         where="--weights", fix="drop the option")
    if manifest.framework != "torch":
        if not enable_prefix_caching or prefix_cache_memory != DEFAULT_PREFIX_CACHE_MIB:
            raise ServeError("--no-enable-prefix-caching and --prefix-cache-memory set the built-in runtime's prefix "
                             "cache, and this artifact is served by vLLM", where=str(path),
                             fix="drop the option: vLLM's own prefix caching applies on Neuron")
        if max_prefill_tokens is not None:
            raise ServeError("--max-prefill-tokens sets the built-in runtime's scheduling, and this artifact is served "
                             "by vLLM", where=str(path), fix="drop the option: on Neuron the compiled buckets decide "
                                                             "what one step prefills")
        if manifest.framework == "vneuron":
            if vllm_target != "auto":
                raise ServeError("a vneuron artifact is served by the SDK 2.31+ vLLM Neuron plugin only",
                                 where="--vllm-target", fix="drop the option")
            _launch_plugin(path, manifest, host=host, port=port, api_key=api_key, print_only=print_command,
                           output_format=output_format, weights=weights, tool_call_parser=tool_call_parser)
            return
        _launch_vllm(path, manifest, host=host, port=port, api_key=api_key, print_only=print_command,
                     output_format=output_format, requested_target=vllm_target, tool_call_parser=tool_call_parser,
                     structured_outputs=structured_outputs)
        return
    if tool_call_parser not in (None, "hermes"):
        raise ServeError(f"the built-in server parses hermes tool calls only, not {tool_call_parser!r}",
                         where="--tool-call-parser", fix="drop the option or pass hermes")
    limits = _ServeLimits(max_body_bytes, max_waiting, request_timeout, shutdown_grace, max_prefill_tokens,
                          enable_prefix_caching, prefix_cache_memory)
    if print_command:
        argv = [sys.executable, "-m", "neuronpack", "serve", str(path), "--host", host, "--port", str(port),
                *limits.argv()]
        if served_model_name:
            argv += ["--served-model-name", served_model_name]
        if api_key:
            argv += ["--api-key", api_key]
        _print_command(argv, {}, [], output_format)
        return
    _serve_torch(path, manifest, host=host, port=port, api_key=api_key, threads=threads, reporter=reporter,
                 quiet=quiet, limits=limits)


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


class _ServeLimits(NamedTuple):
    max_body_bytes: int
    max_waiting: int
    request_timeout: float
    shutdown_grace: float
    max_prefill_tokens: int | None = None
    prefix_caching: bool = True
    prefix_cache_memory: float = DEFAULT_PREFIX_CACHE_MIB

    def argv(self) -> list[str]:
        budget = ["--max-prefill-tokens", str(self.max_prefill_tokens)] if self.max_prefill_tokens else []
        if not self.prefix_caching:
            budget.append("--no-enable-prefix-caching")
        elif self.prefix_cache_memory != DEFAULT_PREFIX_CACHE_MIB:
            budget += ["--prefix-cache-memory", f"{self.prefix_cache_memory:g}"]
        return ["--max-body-bytes", str(self.max_body_bytes), "--max-waiting", str(self.max_waiting),
                "--request-timeout", f"{self.request_timeout:g}", "--shutdown-grace", f"{self.shutdown_grace:g}",
                *budget]


def _serve_torch(path: Path, manifest: Manifest, *, host: str, port: int, api_key: str | None,
                 threads: int | None, reporter: RichReporter, quiet: bool, limits: _ServeLimits) -> None:
    from neuronpack.runtime.engine import EngineLimits
    from neuronpack.runtime.engine.prefix_cache import PrefixCaching
    from neuronpack.runtime.loader import available_cores, load_engine
    from neuronpack.runtime.openai.http_limits import ServerLimits
    from neuronpack.runtime.openai.memory import limit_malloc_arenas, release_free_memory
    from neuronpack.runtime.openai.server import create_app, run_server

    engine_limits = EngineLimits(max_waiting=limits.max_waiting, request_timeout=limits.request_timeout or None,
                                 max_prefill_tokens=limits.max_prefill_tokens)
    limit_malloc_arenas()  # before the server's threads exist: see runtime/openai/memory.py
    # loaded on one thread, so only the engine's loop opens OpenMP teams (Engine.loop_threads)
    caching = PrefixCaching(enabled=limits.prefix_caching, memory_mib=limits.prefix_cache_memory)
    loaded = load_engine(path, manifest=manifest, num_threads=1, reporter=reporter, limits=engine_limits,
                         prefix_caching=caching)
    loaded.engine.loop_threads = threads or available_cores()
    release_free_memory()  # the model's construction freed its temporary tensors
    name = loaded.served_model_name
    app = create_app(loaded.engine, served_model_name=name, api_key=api_key,
                     model_info={"root": str(path)}, limits=ServerLimits(max_body_bytes=limits.max_body_bytes),
                     adapter_roots=dict(loaded.served_models().roots))
    engine = loaded.engine
    reporter.info(f"loaded {name} in {loaded.load_seconds:.1f} s (batch {engine.scheduler.batch_size}, "
                  f"max model length {engine.max_model_len}, largest prompt {engine.max_prompt_len}, "
                  f"{engine.loop_threads} compute thread{'' if engine.loop_threads == 1 else 's'})")
    rows = engine.scheduler.rows
    mib = rows.cache_rows * engine.model.kv_row_bytes / 2**20
    reporter.info(f"prefix caching: {rows.cache_rows} cache rows ({mib:.0f} MiB) beyond the batch" if rows.caching
                  else f"prefix caching off: {engine.prefix_caching_off_reason}")
    # an info line like the others: --quiet leaves only warnings and errors (a supervisor's log stays empty)
    reporter.info(f"serving {name} at http://{_url_host(host)}:{port}/v1 (health: /health, metrics: /metrics)")
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        reporter.warn(f"listening on {host} without --api-key: anyone who can reach this port can use the model")
    run_server(app, host=host, port=port, log_level="warning" if quiet else "info",
               shutdown_grace=limits.shutdown_grace)


def _launch_vllm(path: Path, manifest: Manifest, *, host: str, port: int, api_key: str | None,
                 print_only: bool, output_format: OutputFormat, requested_target: str,
                 tool_call_parser: str | None, structured_outputs: bool) -> None:
    from neuronpack.backends.neuron.support_matrix import installed_versions
    from neuronpack.backends.vllm.launch import launch_spec, run_vllm
    from neuronpack.backends.vllm.targets import check_serving_stack, choose_target, vllm_command

    installed = installed_versions()
    choice = choose_target(requested_target, manifest.framework, installed)
    cmd = vllm_command(path, manifest, target=choice.name, host=host, port=port, api_key=api_key,
                       tool_call_parser=tool_call_parser, structured_outputs=structured_outputs,
                       vllm_version=installed.get("vllm"))
    notes = [f"target {choice.name}: {choice.reason}", *cmd.notes]
    if print_only:
        _show_vllm_command(cmd, notes, output_format)
        return
    pairing = check_serving_stack(launch_spec(path, manifest), choice.name, installed)  # refuses before vLLM starts
    _notes(notes)
    stderr.print(f"starting vLLM ({choice.name}, pairing {pairing}) at http://{_url_host(host)}:{port}/v1",
                 markup=False, highlight=False)
    run_vllm(cmd)  # replaces this process; ServeError when vLLM is not installed


def _launch_plugin(path: Path, manifest: Manifest, *, host: str, port: int, api_key: str | None, print_only: bool,
                   output_format: OutputFormat, weights: str | None, tool_call_parser: str | None) -> None:
    """A vneuron artifact: the SDK 2.31+ plugin's ``vllm serve`` with the compiled arguments (the artifact and this
    machine's versions were verified against the manifest on the way here)."""
    from neuronpack.backends.vllm.launch import run_vllm
    from neuronpack.backends.vneuron.launch import plugin_serve_command

    cmd = plugin_serve_command(path, manifest, host=host, port=port, api_key=api_key, weights=weights,
                               tool_call_parser=tool_call_parser)
    if print_only:
        _show_vllm_command(cmd, cmd.notes, output_format)
        return
    Path(cmd.env["VLLM_CACHE_ROOT"]).mkdir(parents=True, exist_ok=True)
    _notes(cmd.notes)
    stderr.print(f"starting vLLM (vLLM Neuron plugin, {manifest.versions.get('vllm-neuron')}) at "
                 f"http://{_url_host(host)}:{port}/v1", markup=False, highlight=False)
    run_vllm(cmd)  # replaces this process; ServeError when vLLM is not installed


def _show_vllm_command(cmd, notes: list[str], output_format: OutputFormat) -> None:
    """``--print-command`` of a vLLM launch: the shell line or ``{target, argv, env, cwd, notes}``; notes on stderr."""
    from neuronpack.backends.vllm.launch import format_command

    print_result(output_format, {"target": cmd.target, "argv": cmd.argv, "env": cmd.env, "cwd": cmd.cwd,
                                 "notes": notes}, format_command(cmd))
    if output_format is OutputFormat.text:
        _notes(notes)


def _notes(notes: list[str]) -> None:
    for note in notes:
        stderr.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)


def _print_command(argv: list[str], env: dict[str, str], notes: list[str], output_format: OutputFormat) -> None:
    print_result(output_format, {"target": "neuronpack", "argv": argv, "env": env, "cwd": None, "notes": notes},
                 " ".join(shlex.quote(a) for a in argv))


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
