"""SIGKILL `quantize`, `convert-eagle` and `import-gguf` at progress markers (killpoints.py): after every kill, OUT is
either absent or the complete output (identical to an uninterrupted run's); only hidden staging directories are
left beside it; the next run succeeds and writes the same output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from neuronpack.checkpoint import open_checkpoint
from neuronpack.digest import sha256_stream
from tests.checkpoint.tiny_gguf import write_tiny_gguf
from tests.fuzz.synthetic import eagle_dtypes, eagle_shapes, llama_config, llama_shapes, write_checkpoint

from .killpoints import kill_sweep

# Fields that record when/how long a run took: they differ between two otherwise identical runs.
VOLATILE = {"created_at", "seconds"}


def snapshot(root: Path) -> dict[str, object]:
    """{relative path: sha256} of every file (JSON files compared without their timing fields)."""
    out: dict[str, object] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            if isinstance(data, dict):
                data = {k: v for k, v in data.items() if k not in VOLATILE}
            out[rel] = data
        else:
            out[rel] = sha256_stream(path)
    return out


class OutputCheck:
    """OUT absent, or complete and equal to the first complete output seen; everything else beside it hidden."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.reference: dict | None = None
        self.complete_seen = 0

    def __call__(self) -> None:
        visible = [p.name for p in self.out.parent.iterdir() if not p.name.startswith(".")]
        assert set(visible) <= {self.out.name}, f"half-written output visible: {visible}"
        if not self.out.exists():
            return
        open_checkpoint(self.out)
        got = snapshot(self.out)
        if self.reference is None:
            self.reference = got
        assert got == self.reference, "an output differs from the uninterrupted run's"
        self.complete_seen += 1

    def reset(self) -> None:
        shutil.rmtree(self.out, ignore_errors=True)

    def leftovers(self) -> int:
        return len([p for p in self.out.parent.iterdir() if p.name.startswith(".neuronpack-staging")])


def _sweep(args: list[str], out: Path, root: Path, report_name: str):
    check = OutputCheck(out)
    sweep = kill_sweep(args, root=root, check=check, reset=check.reset)
    assert check.complete_seen >= 2  # calibration and final runs at least
    assert check.leftovers() == 0, "a later run did not remove the staging directories of killed runs"
    assert sweep.killed >= min(len(sweep.kill_points), 2)
    print(f"{report_name}: {sweep.markers} markers, killed at {sweep.kill_points} ({sweep.killed} kills): "
          f"{sweep.labels}; {check.leftovers()} hidden staging dirs left")
    return sweep


@pytest.mark.timeout(900)
def test_sigkill_during_quantize(tmp_path, tiny_llama):
    work = tmp_path / "work"
    work.mkdir()
    out = work / "q"
    _sweep(["quantize", str(tiny_llama), "--out", str(out), "--dtype", "int8", "--quiet"], out, work, "quantize")


@pytest.mark.timeout(900)
def test_sigkill_during_convert_eagle(tmp_path):
    draft = write_checkpoint(tmp_path / "draft", {n: (eagle_dtypes(n, "F32"), s) for n, s in
                                                  eagle_shapes("eagle1").items()},
                             {"hidden_size": 8, "vocab_size": 16, "bias": True, "model_type": "llama"})
    target = write_checkpoint(tmp_path / "target", {n: ("F32", s) for n, s in llama_shapes().items()}, llama_config(),
                              seed=1)
    work = tmp_path / "work"
    work.mkdir()
    out = work / "draft-nxd"
    _sweep(["convert-eagle", "--draft", str(draft), "--target", str(target), "--out", str(out), "--quiet"], out, work,
           "convert-eagle")


@pytest.mark.timeout(900)
def test_sigkill_during_import_gguf(tmp_path, tiny_llama):
    gguf_file = write_tiny_gguf(tiny_llama, tmp_path / "tiny.gguf")
    work = tmp_path / "work"
    work.mkdir()
    out = work / "imported"
    _sweep(["import-gguf", str(gguf_file), "--out", str(out), "--quiet"], out, work, "import-gguf")
