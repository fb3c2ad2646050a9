"""`make upstream-check UPSTREAM_SRC=DIR`: hold neuronpack's Neuron output against upstream's own code.

For every recipe with an nxd or tnx framework it runs, in this project's environment,
``neuronpack compile --dry-run --format json`` (on a tiny stand-in checkpoint of the recipe's architecture), builds
the artifact with the test stand-in SDK, and prints ``neuronpack serve --print-command --format json`` for every
serving target. Then, in throwaway virtual environments (created under DIR/.venvs, never the project's), it imports
upstream source from DIR with device-only imports stubbed (tools/upstream_stubs.py) and feeds that output to:

- NxD Inference's NeuronConfig / InferenceConfig (+ the draft config as upstream builds it):
  DIR/neuronx-distributed-inference (0.9.0) and DIR/neuronx-distributed (its pure quantization enums; the rest stubbed)
- vLLM 0.9.2's argument parser + EngineArgs (V0): DIR/vllm-0.9.2
- the AWS fork's parser, EngineArgs block-size logic and multi-node launch_script.py:
  DIR/upstreaming-to-vllm (tag 2.24.0)
- vLLM 0.13.0 / 0.16.0's parser + EngineArgs, then vllm-neuron 0.4.1 / 0.5.0's override validation and the runner's
  max_prompt_length check: DIR/vllm-0.13.0 + DIR/vllm-neuron-0.4.1, DIR/vllm-0.16.0 + DIR/vllm-neuron-0.5.0
- vLLM 0.21.0's parser + EngineArgs on the vneuron recipes' serve command (the SDK 2.31+ plugin), then the
  plugin's own envs.py (vllm-neuron 0.21, ../shared/upstream/vllm-neuron-0.21/src) on the environment serve sets: the
  resolver must give the root serve fills, a local miss must be fatal and graph capture off:
  DIR/vllm-0.21.0 (+ the plugin's sources from ../shared)
- on every vLLM column, ``serve --tool-call-parser`` against that vLLM's own ToolParserManager registry (what
  validate_api_server_args checks at start), and ``serve --structured-outputs`` on a host-sampling artifact: the
  real NeuronConfig keeps on_device_sampling_config None (the runners' host-logits path) and V0 gets
  NEURON_ON_DEVICE_SAMPLING_DISABLED=1

- "nxdi-0.9 CPU run": ``neuronpack eval`` of each nxd artifact in .venv-nxdi, where NxD Inference's own modeling code
  runs it on this CPU at tp 1 (closed packages: the strict shim of tests/upstream) against transformers: ok (top-1),
  failed (the figures or NxDI's refusal of the checkpoint), or not run (what upstream's CPU path cannot do, and why)

``UPSTREAM_COLUMNS=TEXT`` keeps only the columns whose name contains TEXT (e.g. ``0.21``).

DIR/vllm-X is a git checkout of vllm-project/vllm at tag vX, or the Python files of the vllm==X wheel (unzip; the .so
files are not needed). DIR/upstreaming-to-vllm and DIR/vllm-neuron-X are the repository's top (vllm/ resp. vllm_neuron/
in it), e.g. ``git archive 2.24.0`` of aws-neuron/upstreaming-to-vllm and of the vllm-neuron release commits 4fac6b7
(0.4.1) and 3afb0a9 (0.5.0), kept in public mirrors such as whn09/vllm-neuron; docs/neuron.md has the commands. The
NxDI columns take NxDI / NxD from DIR when it has them, else from ../shared/upstream beside the clone
(``UPSTREAM_SHARED`` overrides that path): without UPSTREAM_SRC only those two columns run. Prints a table recipe x
target -> ok / failed (reason). Exit 1 when any cell failed. With neither source it says so and exits 0. Upstream code
is read at check time; none of it is copied into the project.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests" / "backends" / "neuron_standin"
NP = [sys.executable, "-m", "neuronpack"]
TARGETS = ("vllm-v0", "vllm-v0-fork", "vllm-neuron")
# venv name -> packages: vLLM's light pure-Python dependencies the parsers import (torch etc. come from the project
# environment through a .pth file; nothing is installed into the project)
VENVS = {"vllm": ["transformers==4.57.1", "msgspec", "cbor2", "pyzmq", "pybase64", "cachetools", "py-cpuinfo",
                  "openai-harmony", "einops", "mistral_common"],
         "vllm-v0": ["transformers==4.53.2"],
         # vLLM 0.21's parser imports more of it (and a newer transformers); its own pins, read from the wheel
         "vllm-0.21": ["transformers>=4.56,<5", "msgspec", "cbor2", "pyzmq", "pybase64", "cachetools", "py-cpuinfo",
                       "openai-harmony", "einops", "mistral_common", "filelock", "psutil"]}
# column -> (venv, source dirs, worker kind, serving target)
NXD = ["neuronx-distributed-inference/src", "neuronx-distributed/src"]
PLUGIN_021 = "vllm-neuron-0.21/src"  # the SDK 2.31+ plugin's partial tree (../shared/upstream)
SHARED_DIRS = (*NXD, PLUGIN_021)
COLUMNS = {
    "nxdi-0.9 config": ("vllm", NXD, "nxdi", None),
    "nxdi-0.9 CPU run": (None, NXD, "nxdi-cpu", None),
    "vllm-v0 (0.9.2)": ("vllm-v0", ["vllm-0.9.2", *NXD], "vllm", "vllm-v0"),
    "vllm-v0-fork (2.24.0)": ("vllm-v0", ["upstreaming-to-vllm", *NXD], "vllm", "vllm-v0-fork"),
    "vllm-neuron 0.4.1 (vLLM 0.13)": ("vllm", ["vllm-0.13.0", "vllm-neuron-0.4.1", *NXD], "vllm", "vllm-neuron"),
    "vllm-neuron 0.5.0 (vLLM 0.16)": ("vllm", ["vllm-0.16.0", "vllm-neuron-0.5.0", *NXD], "vllm", "vllm-neuron"),
    "vllm-neuron 0.21 (vLLM 0.21)": ("vllm-0.21", ["vllm-0.21.0", PLUGIN_021], "vllm", "vneuron"),
}


SHARED = Path(os.environ.get("UPSTREAM_SHARED") or ROOT.parent / "shared" / "upstream")
NXDI_PYTHON = ROOT / ".venv-nxdi" / "bin" / "python"  # made by `make install`: NxDI's transformers 4.57


def main() -> int:
    src = Path(os.environ["UPSTREAM_SRC"]).absolute() if os.environ.get("UPSTREAM_SRC") else None
    if src is None and not all((SHARED / d).is_dir() for d in NXD):
        print("upstream-check skipped: UPSTREAM_SRC is not set (point it at a directory of upstream checkouts; "
              f"see tools/upstream_check.py) and {SHARED} has no NxD Inference sources")
        return 0
    # without UPSTREAM_SRC: only the columns ../shared/upstream has the sources for
    columns = [col for col, (_, dirs, _, _) in COLUMNS.items() if src is not None or set(dirs) <= set(NXD)]
    columns = [col for col in columns if os.environ.get("UPSTREAM_COLUMNS", "") in col]
    missing = [d for col in columns for d in COLUMNS[col][1] if _source(src, d) is None]
    if missing:
        print(f"upstream-check: missing in {src}: {', '.join(sorted(set(missing)))}", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="np-upstream-"))
    try:
        cases = _make_cases(work, src)
        results = {col: _run_column(src, work, col, cases) for col in columns}
    finally:
        if not os.environ.get("UPSTREAM_CHECK_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
    if src is None:
        print(f"NxDI columns from {SHARED}; the vLLM columns need UPSTREAM_SRC")
    return _print_table(cases, results)


def _source(src: Path | None, directory: str) -> Path | None:
    """Where ``directory`` (an upstream source tree) is: in UPSTREAM_SRC, else (NxDI / NxD) in ../shared/upstream."""
    for base in (src, SHARED if directory in SHARED_DIRS else None):
        if base is not None and (base / directory).is_dir():
            return base / directory
    return None


# --- neuronpack's side (project environment) -------------------------------------------------------------------------
def _make_cases(work: Path, src: Path) -> list[dict]:
    sys.path[:0] = [str(ROOT)]
    from tests.convert.eagle_fixtures import make_eagle1_draft
    from tests.helpers.lora_adapters import make_peft_adapter
    from tests.helpers.tiny_models import make_tiny_checkpoint
    from tests.upstream.family_checkpoints import RECIPE_FAMILY, recipe_family, write_family_checkpoint

    llama = make_tiny_checkpoint(work / "llama")
    vocab = json.loads((llama / "config.json").read_text())["vocab_size"]
    draft = make_eagle1_draft(work / "eagle", hidden=64, vocab=vocab, layout="safetensors")
    mllama = _tiny_mllama(llama, work / "mllama")
    # each 2026 family in its released layout (gpt-oss: MXFP4 experts; Llama 4: Meta's multimodal layout)
    families = {name: write_family_checkpoint(work / name, name) for name in set(RECIPE_FAMILY.values())}
    adapter = make_peft_adapter(llama, work / "adapters" / "sql", rank=8, target_modules=("q_proj", "v_proj"))
    cases = []
    for recipe in sorted((ROOT / "recipes").glob("*.toml")):
        text = recipe.read_text()
        if not any(f'framework = "{f}"' in text for f in ("nxd", "tnx", "vneuron")):
            continue
        family = recipe_family(recipe)
        model = mllama if "Vision" in text else families[family] if family else llama
        sets = ["--set", f"speculation.draft={draft}"] if "[speculation]" in text else []
        cases.append(_case(work, recipe.stem, recipe, model, sets))
    # LoRA and multi-node: no shipped recipe has them; check them on the inf2 recipe
    base = ROOT / "recipes" / "llama-3.2-1b-inf2.toml"
    lora = work / "lora.toml"
    lora.write_text(base.read_text() + f'\n[lora]\nmax_rank = 16\ntarget_modules = ["q_proj", "v_proj"]\n'
                                       f'adapters = [{{name = "sql", path = "{adapter}"}}]\n')
    cases.append(_case(work, "llama-3.2-1b-inf2 + lora", lora, llama, []))
    cases.append(_case(work, "llama-3.2-1b-inf2 x 2 nodes", base, llama,
                       ["--set", "target.nodes=2", "--set", "target.tp_degree=4"]))
    # structured outputs need host sampling (vllm_structured.py); tool calling: the parser name vLLM must register
    cases.append(_case(work, "llama-3.2-1b-inf2 host sampling + tools", base, llama,
                       ["--set", "sampling.on_device=false"],
                       serve_args=["--structured-outputs", "--tool-call-parser", "hermes"]))
    return cases


def _case(work: Path, name: str, recipe: Path, model: Path, sets: list[str], serve_args: list[str] = ()) -> dict:
    root = work / "root" / name.replace(" ", "_")
    dry = json.loads(_np(["compile", str(model), "--recipe", str(recipe), "--dry-run", "--format", "json",
                          "--out-root", str(root), *sets]))
    framework = dry.get("framework")
    sdk = {"nxd": [STANDIN / "nxd", STANDIN / "compiler"], "tnx": [STANDIN / "tnx", STANDIN / "compiler"],
           "vneuron": [STANDIN / "vneuron", SHARED / PLUGIN_021]}[framework]
    built = _np(["compile", str(model), "--recipe", str(recipe), "--out-root", str(root), *sets],
                pythonpath=sdk).strip().splitlines()[-1]
    serve = {}
    for target in ("vneuron",) if framework == "vneuron" else TARGETS:
        flags = [] if framework == "vneuron" else ["--vllm-target", target]
        try:
            serve[target] = json.loads(_np(["serve", built, "--print-command", "--format", "json", *flags,
                                            *serve_args], pythonpath=sdk))
        except subprocess.CalledProcessError as exc:
            serve[target] = {"refused": (exc.stderr or "").strip().splitlines()[-1][:200]}
    return {"name": name, "framework": framework, "dry": dry, "artifact": built, "serve": serve, "model": str(model)}


def _tiny_mllama(llama: Path, out: Path) -> Path:
    """The tiny llama's weights with a Mllama config (dry-run and the config classes read config.json only)."""
    from transformers import MllamaConfig

    shutil.copytree(llama, out)
    text = json.loads((llama / "config.json").read_text())
    text.pop("architectures", None)
    config = MllamaConfig(text_config={**text, "cross_attention_layers": [1]},
                          vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                         "num_global_layers": 1, "attention_heads": 2, "image_size": 56,
                                         "patch_size": 14, "max_num_tiles": 4, "intermediate_layers_indices": [0]})
    config.architectures = ["MllamaForConditionalGeneration"]
    config.save_pretrained(out)
    return out


def _np(args: list[str], pythonpath: list[Path] = ()) -> str:
    env = {**os.environ, "NEURONPACK_CACHE_DIR": os.environ.get("NEURONPACK_CACHE_DIR", "")}
    env.pop("NEURONPACK_CACHE_DIR") if not env["NEURONPACK_CACHE_DIR"] else None
    if pythonpath:
        # this checkout's neuronpack after the stand-ins (not whichever one the environment has installed)
        env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in pythonpath), str(ROOT)])
    out = subprocess.run([*NP, *args], capture_output=True, text=True, env=env, check=True)
    return out.stdout


# --- upstream's side (throwaway venvs) -------------------------------------------------------------------------------
def _venv(src: Path | None, name: str) -> Path:
    base = src / ".venvs" if src is not None else Path(tempfile.gettempdir()) / "neuronpack-upstream-check-venvs"
    path = base / name
    python = path / "bin" / "python"
    fresh = not python.exists()
    if fresh:
        subprocess.run([str(Path(sys.base_prefix) / "bin" / "python3"), "-m", "venv", str(path)], check=True)
    site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True,
                          text=True, check=True).stdout.strip()
    chain = [str(base / "vllm" / "lib" / Path(site).parent.name / "site-packages")] if name == "vllm-v0" else []
    project = subprocess.run([sys.executable, "-c", "import site; print(site.getsitepackages()[0])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # Written on every run: a reused venv must see THIS project's environment (it may have moved since).
    Path(site, "zz_upstream_check.pth").write_text("\n".join([*chain, project]) + "\n")
    if fresh:
        subprocess.run([str(python), "-m", "pip", "install", "-q", *VENVS[name]], check=True)
    return python


def _run_column(src: Path | None, work: Path, column: str, cases: list[dict]) -> dict[str, str]:
    venv, dirs, kind, target = COLUMNS[column]
    if kind == "nxdi-cpu":
        return {str(i): _cpu_run(case, [_source(src, d) for d in dirs], work) for i, case in enumerate(cases)}
    if venv == "vllm-v0":
        _venv(src, "vllm")
    python = _venv(src, venv)
    inputs, results = [], {}
    for i, case in enumerate(cases):
        cid = str(i)
        config = case["dry"]  # the compile_config, as --dry-run --format json prints it
        served = json.loads((Path(case["artifact"]) / "neuronpack.json").read_text())["serve"]
        if kind == "nxdi":
            if case["framework"] != "nxd":
                results[cid] = f"n/a ({case['framework']})"
                continue
            inputs.append({"id": cid, "model_class": config["model_class"], "neuron_config": config["neuron_config"],
                           "vision_neuron_config": config.get("vision_neuron_config"),
                           "platform_target": config.get("platform_target"),
                           "model_dir": case["model"], "cwd": case["artifact"],
                           "draft": config.get("draft") and {**config["draft"], "path": _bundled_draft(case)}})
            continue
        if target not in case["serve"]:
            results[cid] = f"n/a ({case['framework']})"
            continue
        serve = case["serve"][target]
        if "refused" in serve:
            results[cid] = f"refused: {serve['refused']}"
            continue
        inputs.append({"id": cid, "target": target, "argv": serve["argv"], "env": serve["env"],
                       "cwd": serve.get("cwd") or case["artifact"],
                       "neuron_config": config.get("neuron_config"), "model_class": config.get("model_class"),
                       "architecture": config.get("architecture"),
                       "platform_target": config.get("platform_target"),
                       "max_model_len": served["max_model_len"], "nodes": served.get("nodes", 1),
                       "vllm_src": str(_source(src, dirs[0]))})
    path = work / f"cases-{len(results)}-{abs(hash(column))}.json"
    path.write_text(json.dumps(inputs))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
           "PYTHONPATH": os.pathsep.join(str(_source(src, d)) for d in dirs), "VLLM_TARGET_DEVICE": "cpu"}
    out = subprocess.run([str(python), str(Path(__file__).with_name("upstream_check_worker.py")), kind, str(path)],
                         capture_output=True, text=True, env=env, cwd=work)
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            results[row["id"]] = row["result"]
    for item in inputs:
        results.setdefault(item["id"], f"failed: worker crashed: {(out.stderr.strip().splitlines() or [''])[-1]}")
    return results


def _cpu_run(case: dict, sources: list[Path], work: Path) -> str:
    """``neuronpack eval`` of the case's artifact with upstream NxDI's CPU path (tests/upstream/shim_site)."""
    if case["framework"] != "nxd":
        return f"n/a ({case['framework']})"
    if not NXDI_PYTHON.is_file():
        return f"failed: {NXDI_PYTHON} is missing (run `make install`)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "upstream" / "shim_site"), str(ROOT)]),
           "NEURONPACK_UPSTREAM_PATH": os.pathsep.join(str(s) for s in sources), "PYTHONWARNINGS": "ignore",
           "NEURONPACK_CLOSED_CALLS": str(work / "closed-calls.json")}
    out = subprocess.run([str(NXDI_PYTHON), "-m", "neuronpack", "eval", case["artifact"], "--format", "json",
                          "--max-new-tokens", "8", "--progress", "none"], capture_output=True, text=True, env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]  # NxD logs on stdout too
    if not lines:
        errors = [line for line in out.stderr.splitlines() if line.startswith("error")] or out.stderr.splitlines()
        return f"failed: {(errors or ['no output'])[-1][:200]}"
    report = json.loads(lines[-1])
    if report["status"] == "passed":
        return f"ok (top-1 {report['summary']['top1_agreement']:.3f}, tp 1 on CPU)"
    if report["status"] == "not_run":
        return f"not run: {report['reason'][:160]}"
    return f"failed: {'; '.join(report['failures'])[:200]}"


def _bundled_draft(case: dict) -> str:
    bundled = Path(case["artifact"]) / "draft"
    return str(bundled) if (bundled / "config.json").is_file() else case["dry"]["draft"]["path"]


def _print_table(cases: list[dict], results: dict[str, dict[str, str]]) -> int:
    failed = 0
    header = ["recipe", *results]
    rows = []
    for i, case in enumerate(cases):
        cells = [results[col].get(str(i), "?") for col in results]
        failed += sum(c.startswith("failed") for c in cells)
        rows.append([case["name"], *cells])
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\n{failed} failed cell(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
