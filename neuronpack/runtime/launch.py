"""`neuronpack serve` as a library: which server an artifact gets, with the options that do not apply to it refused,
and for a torch artifact the loaded engine and its OpenAI app, built from the options and run.

The glue at runtime/'s top: it wires the loader, the engine and the HTTP face (runtime/openai/) and hands Neuron
artifacts to vLLM (backends/vllm/serving.py), so the command (cli/serve_cmd.py) only parses, prints and exits. Every
launch answers the same four calls: ``printed()`` (what ``--print-command`` shows), ``notes``, ``prepare()`` (checks
before anything starts; a line to print, or None) and ``start(reporter)`` (serves until stopped, or becomes vLLM).

Example::

    launch = serve_launch(path, read_manifest(path), ServeOptions(port=8080))
    launch.printed()[1]                            # "/usr/bin/python -m neuronpack serve /art/3f2a... --port 8080 ..."
    served = launch.build(NullReporter())          # a torch artifact: the loaded engine and its app, not yet serving
    served.summary.batch_size, served.summary.cache_mib
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.backends.vllm.serving import VllmLaunch, request_log_note, server_url, vllm_launch
from neuronpack.errors import ServeError
from neuronpack.progress import Reporter
from neuronpack.runtime.limits import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_WAITING,
    DEFAULT_PREFIX_CACHE_MIB,
    DEFAULT_REQUEST_LOG_BACKUPS,
    DEFAULT_REQUEST_LOG_MIB,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_SHUTDOWN_GRACE,
)

if TYPE_CHECKING:
    from neuronpack.artifacts.manifest import Manifest
    from neuronpack.runtime.engine import EngineSummary
    from neuronpack.runtime.loader import LoadedEngine

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ServeLimits:
    """The built-in runtime's limits (docs/serve.md, "Limits"): the HTTP body cap, the waiting queue, the request
    deadline (0: none), the shutdown grace, the prefill budget and the prefix cache."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_waiting: int = DEFAULT_MAX_WAITING
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE
    max_num_batched_tokens: int | None = None
    prefix_caching: bool = True
    prefix_cache_memory: float = DEFAULT_PREFIX_CACHE_MIB

    def argv(self) -> list[str]:
        """These limits as ``neuronpack serve`` flags (the ones left at their default for the prefill budget and the
        prefix cache are left out)."""
        budget = (["--max-num-batched-tokens", str(self.max_num_batched_tokens)] if self.max_num_batched_tokens
                  else [])
        if not self.prefix_caching:
            budget.append("--no-enable-prefix-caching")
        elif self.prefix_cache_memory != DEFAULT_PREFIX_CACHE_MIB:
            budget += ["--prefix-cache-memory", f"{self.prefix_cache_memory:g}"]
        return ["--max-body-bytes", str(self.max_body_bytes), "--max-waiting", str(self.max_waiting),
                "--request-timeout", f"{self.request_timeout:g}", "--shutdown-grace", f"{self.shutdown_grace:g}",
                *budget]


@dataclass(frozen=True)
class RequestLogOptions:
    """``--request-log``: the file, the size it rotates at, how many rotated files are kept, and whether each line
    carries the prompt's text (docs/serve.md, "The request log")."""

    path: Path
    max_mib: float = DEFAULT_REQUEST_LOG_MIB
    backups: int = DEFAULT_REQUEST_LOG_BACKUPS
    prompts: bool = False

    def argv(self) -> list[str]:
        """These options as ``neuronpack serve`` flags."""
        return ["--request-log", str(self.path), "--request-log-max-mib", f"{self.max_mib:g}", "--request-log-backups",
                str(self.backups), *(["--request-log-prompts"] if self.prompts else [])]


@dataclass(frozen=True)
class ServeOptions:
    """Everything ``neuronpack serve`` takes besides the artifact. ``threads``, ``limits`` and a ``tool_call_parser``
    other than hermes are the built-in runtime's, and ``request_log`` (a Neuron server notes how vLLM gives the same
    sample); ``vllm_target`` and ``structured_outputs`` vLLM's (nxd / tnx); ``weights`` the vLLM Neuron plugin's
    (vneuron). ``log_level``: uvicorn's. ``reasoning_parser``: vLLM's name of the parser that splits the model's
    reasoning into ``reasoning_content`` (runtime/openai/reasoning.py)."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    served_model_name: str | None = None
    threads: int | None = None
    tool_call_parser: str | None = None
    limits: ServeLimits = field(default_factory=ServeLimits)
    vllm_target: str = "auto"
    structured_outputs: bool = False
    weights: str | None = None
    log_level: str = "info"
    request_log: RequestLogOptions | None = None
    reasoning_parser: str | None = None


@dataclass(frozen=True)
class ServedApp:
    """A torch artifact loaded for serving: the OpenAI app over its engine (not started), and what serve reports."""

    app: Any  # fastapi.FastAPI
    loaded: LoadedEngine
    summary: EngineSummary


@dataclass(frozen=True)
class TorchLaunch:
    """The built-in runtime serving a torch artifact."""

    artifact_dir: Path
    manifest: Manifest
    options: ServeOptions
    notes: list[str] = field(default_factory=list)

    def printed(self) -> tuple[dict[str, Any], str]:
        """``--print-command``: the JSON object and the shell line of this same server."""
        o = self.options
        argv = [sys.executable, "-m", "neuronpack", "serve", str(self.artifact_dir), "--host", o.host, "--port",
                str(o.port), *o.limits.argv()]
        if o.served_model_name:
            argv += ["--served-model-name", o.served_model_name]
        if o.api_key:
            argv += ["--api-key", o.api_key]
        if o.request_log is not None:
            argv += o.request_log.argv()
        if o.reasoning_parser:
            argv += ["--reasoning-parser", o.reasoning_parser]
        data = {"target": "neuronpack", "argv": argv, "env": {}, "cwd": None, "notes": self.notes}
        return data, " ".join(shlex.quote(a) for a in argv)

    def prepare(self) -> str | None:
        """The artifact was verified for this machine when it was resolved and loading checks the rest: only the
        request log's path is checked here, before the model loads."""
        if self.options.request_log is not None:
            from neuronpack.runtime.openai.request_log import check_request_log

            check_request_log(self.options.request_log.path)
        return None

    def build(self, reporter: Reporter) -> ServedApp:
        """Load the engine on this thread (so only the engine's loop opens OpenMP teams, ``Engine.loop_threads``),
        give its loop the threads, and build the app; report what was loaded."""
        from neuronpack.runtime.engine import EngineLimits
        from neuronpack.runtime.engine.prefix_cache import PrefixCaching
        from neuronpack.runtime.loader import available_cores, load_engine
        from neuronpack.runtime.openai.http_limits import ServerLimits
        from neuronpack.runtime.openai.memory import limit_malloc_arenas, release_free_memory
        from neuronpack.runtime.openai.server import create_app

        o, limits = self.options, self.options.limits
        engine_limits = EngineLimits(max_waiting=limits.max_waiting, request_timeout=limits.request_timeout or None,
                                     max_num_batched_tokens=limits.max_num_batched_tokens)
        limit_malloc_arenas()  # before the server's threads exist: see runtime/openai/memory.py
        caching = PrefixCaching(enabled=limits.prefix_caching, memory_mib=limits.prefix_cache_memory)
        loaded = load_engine(self.artifact_dir, manifest=self.manifest, num_threads=1, reporter=reporter,
                             limits=engine_limits, prefix_caching=caching)
        loaded.engine.loop_threads = o.threads or available_cores()
        release_free_memory()  # the model's construction freed its temporary tensors
        s = loaded.engine.summary()
        reporter.info(f"loaded {loaded.served_model_name} in {loaded.load_seconds:.1f} s (batch {s.batch_size}, "
                      f"max model length {s.max_model_len}, largest prompt {s.max_prompt_len}, "
                      f"{s.threads} compute thread{'' if s.threads == 1 else 's'})")
        reporter.info(s.prefix_cache_line())
        reporter.info(s.chunked_prefill_line())
        app = create_app(loaded.engine, served_model_name=loaded.served_model_name, api_key=o.api_key,
                         model_info={"root": str(self.artifact_dir)},
                         limits=ServerLimits(max_body_bytes=limits.max_body_bytes),
                         adapter_roots=dict(loaded.served_models().roots),
                         request_log=self._request_log(loaded, reporter),
                         chat_format=self._chat_format(loaded, reporter))
        return ServedApp(app, loaded, s)

    def _chat_format(self, loaded: LoadedEngine, reporter: Reporter):
        o = self.options
        chat, line = chat_format_for(artifact_model_type(self.artifact_dir), o.reasoning_parser,
                                     loaded.engine.tokenizer, where=str(self.artifact_dir),
                                     tool_call_parser=o.tool_call_parser)
        if line:
            reporter.info(line)
        return chat

    def _request_log(self, loaded: LoadedEngine, reporter: Reporter):
        """The server's RequestLog (None without ``--request-log``), and the line that says where it goes."""
        options = self.options.request_log
        if options is None:
            return None
        from neuronpack.runtime.openai.request_log import RequestLog

        log = RequestLog(options.path, max_bytes=max(1, int(options.max_mib * 2**20)), backups=options.backups,
                         decode=loaded.engine.tokenizer.decode if options.prompts else None, warn=reporter.warn)
        reporter.info(f"request log: {options.path} (rotated at {options.max_mib:g} MiB, {options.backups} kept"
                      f"{'; with the prompts' if options.prompts else ''})")
        return log

    def start(self, reporter: Reporter) -> None:
        """Build, then serve until SIGTERM / SIGINT (graceful: in-flight requests get the shutdown grace)."""
        from neuronpack.runtime.openai.server import run_server

        o = self.options
        served = self.build(reporter)
        # an info line like the others: --quiet leaves only warnings and errors (a supervisor's log stays empty)
        reporter.info(f"serving {served.loaded.served_model_name} at {server_url(o.host, o.port)} "
                      "(health: /health, metrics: /metrics)")
        if o.host not in LOOPBACK and not o.api_key:
            reporter.warn(f"listening on {o.host} without --api-key: anyone who can reach this port can use the "
                          "model")
        run_server(served.app, host=o.host, port=o.port, log_level=o.log_level,
                   shutdown_grace=o.limits.shutdown_grace)


def serve_launch(artifact_dir: Path, manifest: Manifest, options: ServeOptions) -> TorchLaunch | VllmLaunch:
    """The server ``manifest``'s artifact gets: the built-in runtime for torch, vLLM for nxd / tnx, the vLLM Neuron
    plugin for vneuron. ServeError (what, where, fix) for an option that does not apply to it."""
    refuse_options(manifest.framework, options, where=str(artifact_dir))
    if options.served_model_name:
        manifest = manifest.with_serve(served_model_name=options.served_model_name)
    o = options
    if manifest.framework == "torch":
        return TorchLaunch(Path(artifact_dir), manifest, options)
    if manifest.framework == "vneuron":  # the artifact and this machine's versions were verified on resolving it
        from neuronpack.backends.vneuron.launch import plugin_serve_command

        cmd = plugin_serve_command(artifact_dir, manifest, host=o.host, port=o.port, api_key=o.api_key,
                                   weights=o.weights, tool_call_parser=o.tool_call_parser)
        launch = VllmLaunch(cmd, list(cmd.notes), server_url(o.host, o.port),
                            f"vLLM Neuron plugin, {manifest.versions.get('vllm-neuron')}")
    else:
        launch = vllm_launch(artifact_dir, manifest, host=o.host, port=o.port, api_key=o.api_key,
                             requested_target=o.vllm_target, tool_call_parser=o.tool_call_parser,
                             structured_outputs=o.structured_outputs)
    if o.request_log is not None:  # vLLM writes no such file: say where the same sample comes from
        launch.notes.append(request_log_note(launch.command.target))
    return launch


def chat_format_for(model_type: str | None, reasoning_parser: str | None, tokenizer: Any, *, where: str,
                    tool_call_parser: str | None = None) -> tuple[Any, str | None]:
    """How a model chats, and the line serve logs about it: gpt-oss (model_type gpt_oss) in harmony, as vLLM
    switches on the model type (its reasoning parser openai_gptoss set by itself, its tool calls vLLM's ``openai``
    parser's); any other model through its chat template (Hermes tool calls), with ``reasoning_parser``'s split when
    given. ServeError for a parser that does not fit the model."""
    from neuronpack.runtime.openai.chat_format import TemplateChat
    from neuronpack.runtime.openai.reasoning import HARMONY_PARSER, ThinkParser

    tools = "openai" if model_type == "gpt_oss" else "hermes"  # vLLM's names of the two tool-call parsers
    if tool_call_parser not in (None, tools):
        raise ServeError(f"this artifact's tool calls are read with {tools} (model type {model_type!r}), "
                         f"not {tool_call_parser!r}", where="--tool-call-parser",
                         fix=f"drop it or pass {tools}")
    if model_type == "gpt_oss":
        if reasoning_parser not in (None, HARMONY_PARSER):
            raise ServeError(f"gpt-oss chats in harmony, whose reasoning parser is {HARMONY_PARSER}, not "
                             f"{reasoning_parser!r}", where="--reasoning-parser",
                             fix=f"drop the option or pass {HARMONY_PARSER}")
        from neuronpack.runtime.openai.harmony import HarmonyChat

        return HarmonyChat.load(tokenizer), f"chat format: harmony (gpt-oss), reasoning parser {HARMONY_PARSER}"
    if reasoning_parser == HARMONY_PARSER:
        raise ServeError(f"{HARMONY_PARSER} reads gpt-oss's harmony format, and this artifact's model type is "
                         f"{model_type!r}", where="--reasoning-parser", fix="pass the parser of this model family")
    if reasoning_parser is None:
        return TemplateChat(), None
    parser = ThinkParser.load(reasoning_parser, tokenizer.token_id, where=where)
    return TemplateChat(parser), f"reasoning parser: {reasoning_parser} ({parser.tags.start}...{parser.tags.end} " \
                                 "to reasoning_content)"


def artifact_model_type(artifact_dir: Path) -> str | None:
    """The ``model_type`` of an artifact's config.json (None when it has none)."""
    import json

    try:
        config = json.loads((Path(artifact_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config.get("model_type") if isinstance(config, dict) else None


def refuse_options(framework: str, options: ServeOptions, *, where: str) -> None:
    """ServeError for a serve option that the server of a ``framework`` artifact would not honour."""
    limits = options.limits
    if options.reasoning_parser is not None:
        from neuronpack.runtime.openai.reasoning import check_reasoning_parser

        check_reasoning_parser(options.reasoning_parser)
        if framework != "torch":
            raise ServeError("--reasoning-parser sets the built-in runtime's reasoning output, and this artifact is "
                             "served by vLLM", where="--reasoning-parser",
                             fix="drop it, and add vLLM's own --reasoning-parser to the command --print-command shows")
    if options.weights is not None and framework != "vneuron":
        raise ServeError("--weights applies to vneuron artifacts (the others carry or record their weights)",
                         where="--weights", fix="drop the option")
    if framework == "torch":
        if options.tool_call_parser not in (None, "hermes", "openai"):
            raise ServeError(f"the built-in server parses hermes tool calls only (and gpt-oss's harmony ones: vLLM's "
                             f"openai), not {options.tool_call_parser!r}", where="--tool-call-parser",
                             fix="drop the option or pass hermes")
        return
    if not limits.prefix_caching or limits.prefix_cache_memory != DEFAULT_PREFIX_CACHE_MIB:
        raise ServeError("--no-enable-prefix-caching and --prefix-cache-memory set the built-in runtime's prefix "
                         "cache, and this artifact is served by vLLM", where=where,
                         fix="drop the option: vLLM's own prefix caching applies on Neuron")
    if limits.max_num_batched_tokens is not None:
        raise ServeError("--max-num-batched-tokens sets the built-in runtime's scheduling, and this artifact is served "
                         "by vLLM", where=where, fix="drop the option: on Neuron the compiled buckets decide what one "
                                                     "step prefills")
    if framework == "vneuron" and options.vllm_target != "auto":
        raise ServeError("a vneuron artifact is served by the SDK 2.31+ vLLM Neuron plugin only",
                         where="--vllm-target", fix="drop the option")
