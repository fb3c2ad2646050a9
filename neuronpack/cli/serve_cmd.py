"""`neuronpack serve`: an OpenAI-compatible server from an artifact.

torch artifacts run on the built-in runtime (neuronpack.runtime); nxd / tnx artifacts are served by vLLM, started with
the arguments the artifact was compiled with (``--print-command`` shows that command instead of running it). Which
server an artifact gets, and which options apply to it, is runtime/launch.py's: this command parses and prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from neuronpack.cli._console import OutputFormat, RichReporter, print_result, stderr
from neuronpack.cli._options import EndpointOpt, FormatOpt, QuietOpt, RootOpt, SetOpt, check_plain_text
from neuronpack.runtime.limits import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_WAITING,
    DEFAULT_PREFIX_CACHE_MIB,
    DEFAULT_REQUEST_LOG_BACKUPS,
    DEFAULT_REQUEST_LOG_MIB,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_SHUTDOWN_GRACE,
)


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
    reasoning_parser: Annotated[
        str | None, typer.Option("--reasoning-parser",
                                 help="torch artifacts: vLLM's reasoning parser NAME splits the model's thinking into "
                                      "reasoning_content (qwen3, deepseek_r1, mimo; openai_gptoss: gpt-oss's "
                                      "harmony, on by itself for gpt-oss artifacts)")
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
    max_num_batched_tokens: Annotated[
        int | None, typer.Option("--max-num-batched-tokens", "--max-prefill-tokens", min=1,
                                 help="torch artifacts: token positions one step runs while streams decode (vLLM's "
                                      "name): the decode tokens, then chunks of waiting prompts in what is left "
                                      "(default: what keeps a stream's gap near 2.5 decode steps, measured; "
                                      "--max-prefill-tokens: its old name)")
    ] = None,
    enable_prefix_caching: Annotated[
        bool, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching",
                           help="torch artifacts: reuse the KV of prompt prefixes seen before (vLLM's automatic "
                                "prefix caching; off: every prompt is prefilled whole)")
    ] = True,
    prefix_cache_memory: Annotated[
        float, typer.Option("--prefix-cache-memory", min=0.0,
                            help="torch artifacts: MiB of KV blocks (16 tokens each) added to keep cached prefixes in, "
                                 "beyond the batch's own free rows (0: those only)")
    ] = DEFAULT_PREFIX_CACHE_MIB,
    request_log: Annotated[
        Path | None, typer.Option("--request-log", dir_okay=False,
                                  help="torch artifacts: append a JSON line per finished request to FILE "
                                       "(prompt_tokens, completion_tokens, cached_tokens, batch, timestamps: what "
                                       "`neuronpack buckets plan --traffic` reads), written off the engine thread")
    ] = None,
    request_log_max_mib: Annotated[
        float, typer.Option("--request-log-max-mib", min=0.001,
                            help="the request log's size cap: past it FILE becomes FILE.1 and a new FILE begins")
    ] = DEFAULT_REQUEST_LOG_MIB,
    request_log_backups: Annotated[
        int, typer.Option("--request-log-backups", min=1,
                          help="rotated request logs kept (FILE.1 .. FILE.N), the oldest deleted")
    ] = DEFAULT_REQUEST_LOG_BACKUPS,
    request_log_prompts: Annotated[
        bool, typer.Option("--request-log-prompts",
                           help="also write each prompt's text into the request log (never written otherwise)")
    ] = False,
    output_format: FormatOpt = OutputFormat.text,
    quiet: QuietOpt = False,
) -> None:
    """Serve an artifact over an OpenAI-compatible HTTP API (built-in runtime for torch artifacts, vLLM for Neuron)."""
    from neuronpack.artifacts.manifest import read_manifest
    from neuronpack.pipeline import resolve_serving_artifact
    from neuronpack.runtime.launch import RequestLogOptions, ServeLimits, ServeOptions, serve_launch

    if request_log is None and (request_log_prompts or request_log_max_mib != DEFAULT_REQUEST_LOG_MIB
                                or request_log_backups != DEFAULT_REQUEST_LOG_BACKUPS):
        raise typer.BadParameter("applies to the request log: add --request-log FILE",
                                 param_hint="--request-log-max-mib / --request-log-backups / --request-log-prompts")
    reporter = RichReporter(quiet=quiet)
    path = resolve_serving_artifact(artifact_dir, model=model, recipe=recipe, overrides=set_ or [], reporter=reporter,
                                    root=root, endpoint_url=endpoint_url)
    limits = ServeLimits(max_body_bytes, max_waiting, request_timeout, shutdown_grace, max_num_batched_tokens,
                         enable_prefix_caching, prefix_cache_memory)
    options = ServeOptions(host=host, port=port, api_key=api_key, served_model_name=served_model_name,
                           threads=threads, tool_call_parser=tool_call_parser, limits=limits, vllm_target=vllm_target,
                           structured_outputs=structured_outputs, weights=weights,
                           log_level="warning" if quiet else "info", reasoning_parser=reasoning_parser,
                           request_log=RequestLogOptions(request_log, request_log_max_mib, request_log_backups,
                                                         request_log_prompts) if request_log else None)
    launch = serve_launch(path, read_manifest(path), options)
    if print_command:
        data, line = launch.printed()
        print_result(output_format, data, line)
        if output_format is OutputFormat.text:
            _notes(launch.notes)
        return
    banner = launch.prepare()  # refuses before anything starts
    _notes(launch.notes)
    if banner:
        stderr.print(banner, markup=False, highlight=False)
    launch.start(reporter)  # a torch artifact: serves until SIGTERM; vLLM: replaces this process


def _notes(notes: list[str]) -> None:
    for note in notes:
        stderr.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
