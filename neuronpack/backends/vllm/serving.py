"""`neuronpack serve` of a Neuron artifact: the vLLM server it gets, decided once (target, command, notes), checked
against this machine, then started in place of this process.

- nxd / tnx: a target from what is installed or ``--vllm-target`` (targets.py), the artifact's ``LaunchSpec`` read
  once (launch.py) for both the command and the check of the installed stack against the artifact's build;
- vneuron: the SDK 2.31+ plugin's ``vllm serve`` (its command from backends/vneuron/launch.py, wrapped here by
  runtime/launch.py: backends/vneuron imports this package, not the other way), its writable cache root made first.

The caller prints (``--print-command``: ``command`` and ``notes``; a launch: the notes, then the line ``prepare``
returns) and calls ``start``.

Example::

    launch = vllm_launch(path, manifest, host="127.0.0.1", port=8000)
    data, line = launch.printed()                             # what --print-command shows (+ launch.notes)
    banner = launch.prepare()                                 # ServeError when this machine cannot serve it
    launch.start()                                            # never returns
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuronpack.artifacts.manifest import Manifest
from neuronpack.backends.vllm.launch import LaunchSpec, VllmCommand, format_command, launch_spec, run_vllm
from neuronpack.progress import Reporter


@dataclass(frozen=True)
class VllmLaunch:
    """One vLLM server for one artifact: ``command`` (argv, environment, working directory), the ``notes`` shown with
    it, where it will answer (``url``), and what ``prepare`` checks: nxd / tnx, the installed stack against ``spec``;
    vneuron, nothing but the cache root to create."""

    command: VllmCommand
    notes: list[str]
    url: str
    label: str  # what starts: "vllm-neuron" (the target) or "vLLM Neuron plugin, 0.21.0.1.0.0"
    spec: LaunchSpec | None = None  # nxd / tnx
    installed: dict[str, str | None] = field(default_factory=dict)

    def printed(self) -> tuple[dict[str, Any], str]:
        """``--print-command``: ``{target, argv, env, cwd, notes}`` and the shell line (``cd DIR && ENV... argv``)."""
        cmd = self.command
        data = {"target": cmd.target, "argv": cmd.argv, "env": cmd.env, "cwd": cmd.cwd, "notes": self.notes}
        return data, format_command(cmd)

    def prepare(self) -> str:
        """Check this machine before vLLM starts (ServeError otherwise) and return the line that says what starts
        where."""
        if self.spec is None:  # vneuron: the plugin's local cache root must exist
            Path(self.command.env["VLLM_CACHE_ROOT"]).mkdir(parents=True, exist_ok=True)
            return f"starting vLLM ({self.label}) at {self.url}"
        from neuronpack.backends.vllm.targets import check_serving_stack

        pairing = check_serving_stack(self.spec, self.label, self.installed)
        return f"starting vLLM ({self.label}, pairing {pairing}) at {self.url}"

    def start(self, reporter: Reporter | None = None) -> None:
        """Replace this process with vLLM (never returns; ServeError when vLLM is not installed). vLLM reports its
        own progress: ``reporter`` is not used."""
        run_vllm(self.command)


def vllm_launch(artifact_dir: Path, manifest: Manifest, *, host: str, port: int, api_key: str | None = None,
                requested_target: str = "auto", tool_call_parser: str | None = None,
                structured_outputs: bool = False) -> VllmLaunch:
    """An nxd / tnx artifact's launch: the target picked from the installed versions (or ``requested_target``), the
    command for it, and the reason the target was picked as the first note."""
    from neuronpack.backends.neuron.support_matrix import installed_versions
    from neuronpack.backends.vllm.targets import choose_target, spec_command

    installed = installed_versions()
    choice = choose_target(requested_target, manifest.framework, installed)
    spec = launch_spec(artifact_dir, manifest)
    cmd = spec_command(spec, target=choice.name, host=host, port=port, api_key=api_key,
                       tool_call_parser=tool_call_parser, structured_outputs=structured_outputs,
                       vllm_version=installed.get("vllm"))
    return VllmLaunch(cmd, [f"target {choice.name}: {choice.reason}", *cmd.notes], server_url(host, port),
                      choice.name, spec, installed)


def request_log_note(target: str) -> str:
    """The note a Neuron launch prints for ``serve --request-log``, which only the built-in runtime writes: where
    vLLM gives the same sample. Names read in vLLM's sources: the histograms in 0.9.2 (and the AWS fork 2.24.0) to
    0.24.0; ``--disable-log-requests`` (V0: logged by default, prompt token ids at INFO) in 0.9.2 and the fork;
    ``--enable-log-requests`` (V1, off by default, prompt token ids at DEBUG) and ``--enable-prompt-tokens-details``
    in 0.13.0, 0.16.0, 0.21.0 and 0.24.0.

    Example: ``request_log_note("vllm-v0")`` starts with ``"--request-log is written by the built-in runtime only"``.
    """
    logging = ("vLLM V0 logs each request's prompt token ids unless --disable-log-requests" if target.startswith(
        "vllm-v0") else "vLLM's --enable-log-requests logs each request, its prompt token ids at "
                        "VLLM_LOGGING_LEVEL=DEBUG")
    return ("--request-log is written by the built-in runtime only, not by vLLM: for `neuronpack buckets plan`, log "
            "each response's usage (prompt_tokens, completion_tokens; prompt_tokens_details.cached_tokens with vLLM's "
            "--enable-prompt-tokens-details) at your gateway as JSON lines or CSV (docs/buckets.md); vLLM's /metrics "
            "has their distributions (histograms vllm:request_prompt_tokens, vllm:request_generation_tokens); "
            f"{logging}")


def server_origin(host: str, port: int) -> str:
    """The HTTP origin of a server on ``host:port`` (an IPv6 address in brackets).

    Example: ``server_origin("::1", 8000)`` is ``"http://[::1]:8000"``."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def server_url(host: str, port: int) -> str:
    """The OpenAI base URL a server on ``host:port`` answers at (an IPv6 address in brackets).

    Example: ``server_url("::1", 8000)`` is ``"http://[::1]:8000/v1"``."""
    return f"{server_origin(host, port)}/v1"
