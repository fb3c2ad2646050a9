"""`neuronpack doctor`: which framework would build and why, versions, compiler, target, what is missing.

It reports and exits 0 even when nothing Neuron is installed (that is a normal build box for the torch backend).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from neuronpack.cli._console import OutputFormat, cell, print_result
from neuronpack.cli._options import FormatOpt

if TYPE_CHECKING:
    from rich.console import RenderableType

_STATE_STYLE = {"ok": "green", "placeholder": "yellow", "broken": "red", "missing": "dim"}


def doctor_command(*, output_format: FormatOpt = OutputFormat.text) -> None:
    """Show the toolchain neuronpack sees and which framework `compile` would use, and why.

    Python, torch, the C++ compiler, each Neuron package (importable, PyPI placeholder or missing), neuronx-cc, the
    platform target, the framework `auto` picks, the serving pairing of the support matrix (or why it is refused),
    the environment variables in force, and which vLLM Neuron plugin variables a vneuron pod relies on."""
    from neuronpack.backends.environment import environment_report

    report = environment_report()
    print_result(output_format, report, _text(report) if output_format is OutputFormat.text else None)


def _text(report: dict[str, Any]) -> RenderableType:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"neuronpack {report['neuronpack']} doctor", title_justify="left", show_lines=False)
    table.add_column("item", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("detail", overflow="fold")
    py = report["python"]
    table.add_row("python", cell(py["version"]), cell(py["executable"]))
    table.add_row("torch", cell(report["torch"] or "missing"), "read from package metadata (not imported)")
    table.add_row("transformers", cell(report["transformers"] or "missing"), "")
    cxx = report["cxx"]
    table.add_row("C++ compiler", "ok" if cxx["path"] else "missing",
                  cell(f"{cxx['path']}: {cxx['version']}") if cxx["path"] else "AOTInductor needs one (torch backend)")
    for pkg in report["packages"]:
        style = _STATE_STYLE.get(pkg["state"], "")
        state = pkg["state"] + (f" {pkg['version']}" if pkg["version"] and pkg["state"] == "ok" else "")
        table.add_row(pkg["dist"], f"[{style}]{cell(state)}[/]", cell(pkg["reason"]))
    plat = report["platform"]
    table.add_row("instance", cell(plat["instance_type"] or "unknown"), "from DMI product name")
    table.add_row("neuron devices", str(len(plat["neuron_devices"])), cell(" ".join(plat["neuron_devices"])))
    table.add_row("platform target", cell(plat["platform_target_override"] or "unset"),
                  "NEURON_PLATFORM_TARGET_OVERRIDE; compile sets it from the recipe's target.instance")
    fw = report["framework"]
    table.add_row("auto framework", f"[bold]{cell(fw['auto'])}[/]", cell(fw["auto_reason"]))
    eff = fw["effective"]
    table.add_row("with this env", f"[red]{cell('refused')}[/]" if eff["name"] is None else cell(eff["name"]),
                  cell(eff["reason"]))
    serving = report["serving"]
    stack = ", ".join(f"{d} {v}" for d, v in serving["installed"].items() if v) or "none installed"
    if serving["pairing"] and serving["refused"]:
        table.add_row("serving pairing", f"[red]refused: {cell(serving['pairing'])}[/]", cell(stack))
    elif serving["pairing"]:
        table.add_row("serving pairing", f"[green]{serving['pairing']}[/]", cell(stack))
    else:
        table.add_row("serving pairing", "[yellow]not a declared pairing[/]",
                      cell(f"{stack}; supported: {', '.join(p['name'] for p in serving['supported'])} "
                           "(docs/neuron.md)"))
    table.add_row("serving path", "", cell(serving["path"]))
    families = report["nxd_families"]
    table.add_row("nxd families", str(len(families["built"])), cell(", ".join(
        f"{arch} -> {f['model_class']}" for arch, f in families["built"].items())))
    table.add_row("nxd refuses", str(len(families["refused"])), cell("; ".join(
        f"{arch}: {why}" for arch, why in families["refused"].items())))
    for name, value in report["env"].items():
        table.add_row(f"${name}", "set", cell(value))
    variables = report["vneuron_variables"]
    relied = ", ".join(f"{v['name']}={v['value']}" for v in variables if v["value"] is not None)
    unconfirmed = "; ".join(f"{v['name']} ({v['confirmed'].removeprefix('unconfirmed: ')})" for v in variables
                            if v["confirmed"].startswith("unconfirmed"))
    return Group(table, Text("validated here: " + "; ".join(report["validated"])),
                 Text("NOT validated here: " + "; ".join(report["not_validated"])),
                 Text(f"vneuron pods get {relied} and a VLLM_CACHE_ROOT filled from the artifact (names confirmed in "
                      f"vllm-neuron 0.21's source and 0.24's docs); not confirmed, so not relied on: {unconfirmed}"))
