"""The judge of a family NxD Inference computes wrong (Gemma 3 in NxDI 0.9.0, families.REFUSED with ``judged``): the
same CPU run as the accuracy check, on a tiny random checkpoint of the family written by transformers, decides.

NxDI's class for the family runs the checkpoint on this CPU at tp 1 (cpu.py) against transformers, teacher-forced;
the family is accepted when every row's top-1 token agrees and no logit differs by more than ``MAX_ABS``. The tiny
Gemma 3 holds NxDI 0.9.0's hard-coded constants (vocab 262208, rope 1e4 local / 1e6 global x8 linear, eps 1e-6, every
sixth layer global: models/gemma3/modeling_gemma3.py:85,130-137), a window (4) shorter than the scored sequence (24)
and norm weights bfloat16 holds exactly (NxDI keeps Gemma's norm weights in bfloat16), so what is left of a correct
NxDI is float rounding (1e-5); NxDI 0.9.0 agrees on about half the tokens, logits off by 3-6.

The run is a child process (``python -m neuronpack.backends.nxd.defects ARCH OUT``: NxDI's CPU set-up must not reach
the compile that follows) and its verdict is cached per installed NxDI (the sha256 of the source files the defects
live in), in ``$NEURONPACK_CACHE_DIR/nxd-judge/``. Where NxDI does not import (a laptop, a dry-run box) there is no
verdict, and the family stays refused.

Example::

    judge("Gemma3ForCausalLM")   # Verdict(accepted=False, detail="8 of 18 top-1 tokens agree, max |dlogit| 4.8")
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from neuronpack.backends.nxd.families import Family, nxdi_class

MAX_ABS = 1e-3  # float32 on both sides: a correct NxDI differs by rounding only
TOKENS = [2, 105, 9, 17, 4000, 33, 250000, 7, 81, 512, 64, 9, 1000, 77, 3, 45000, 12, 8, 260000, 5, 999, 42, 6, 130]
PROMPT_LEN = 6
GEMMA3 = Family("gemma3", nxdi_class("gemma3.modeling_gemma3", "NeuronGemma3ForCausalLM"),
                "Gemma3InferenceConfig, Gemma3NeuronConfig", no_eagle="NxDI's Gemma 3 model makes no EAGLE `fc` layer")
# the family NxDI builds once the judge accepts it, and the NxDI sources its defects live in (the verdict's key)
JUDGED: dict[str, tuple[Family, tuple[str, ...]]] = {
    "Gemma3ForCausalLM": (GEMMA3, ("neuronx_distributed_inference.models.gemma3.modeling_gemma3",
                                   "neuronx_distributed_inference.models.model_base",
                                   "neuronx_distributed_inference.modules.attention.attention_base")),
}


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    detail: str  # the figures, or why there is no verdict
    ran: bool = True


def judge(arch: str) -> Verdict:
    """The installed NxDI's verdict on ``arch`` (JUDGED), from the cache or a CPU run in a child process."""
    family, modules = JUDGED[arch]
    fingerprint = _fingerprint(modules)
    if fingerprint is None:
        return Verdict(False, "no NxD Inference here to judge it", ran=False)
    cached = _cache_dir() / f"{arch}-{fingerprint[:32]}.json"
    if cached.is_file():
        return Verdict(**json.loads(cached.read_text()))
    verdict = _run_child(arch)
    if verdict.ran:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(asdict(verdict)))
    return verdict


def write_tiny_gemma3(out: Path, seed: int = 0) -> Path:
    """The judge's tiny random Gemma3ForCausalLM (see the module docstring), saved by transformers."""
    import torch
    import transformers

    config = transformers.Gemma3TextConfig(
        vocab_size=262208, hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, sliding_window=4, max_position_embeddings=131072,
        rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 8.0},
        rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    torch.manual_seed(seed)
    model = transformers.Gemma3ForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.15)
            else:  # Gemma's norms scale by 1 + w: w on a 1/64 grid keeps 1 + w exact in bfloat16
                param.copy_(torch.randint(-16, 17, param.shape) / 64.0)
    model.save_pretrained(out)
    return Path(out)


# --- private ---------------------------------------------------------------------------------------------------------
def _fingerprint(modules: tuple[str, ...]) -> str | None:
    """sha256 over the installed source files of ``modules`` (found without importing them); None when NxDI is not
    installed as importable source here."""
    digest = hashlib.sha256()
    for name in modules:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        if spec is None or not spec.origin or not Path(spec.origin).is_file():
            return None
        digest.update(Path(spec.origin).read_bytes())
    return digest.hexdigest()


def _cache_dir() -> Path:
    from neuronpack.digest import cache_dir

    return cache_dir() / "nxd-judge"


def _run_child(arch: str) -> Verdict:
    with tempfile.TemporaryDirectory(prefix="neuronpack-judge-") as tmp:
        out = Path(tmp) / "verdict.json"
        # NxD's logger writes its set-up lines on stdout: dropped; the verdict comes back in a file
        proc = subprocess.run([sys.executable, "-m", __name__, arch, str(out)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        if not out.is_file():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return Verdict(False, f"the CPU run died (exit {proc.returncode}): {last[:300]}", ran=False)
        return Verdict(**json.loads(out.read_text()))


def run_judge(arch: str, out: Path) -> None:
    """The CPU run itself: NxDI's class vs transformers on the tiny checkpoint; the verdict as JSON in ``out``."""
    import torch
    import transformers

    from neuronpack.backends.nxd import cpu

    family, _ = JUDGED[arch]
    if not cpu.nxdi_importable():
        out.write_text(json.dumps(asdict(Verdict(False, "NxD Inference does not import here", ran=False))))
        return
    with tempfile.TemporaryDirectory(prefix="neuronpack-judge-model-") as tmp:
        model_dir = str(write_tiny_gemma3(Path(tmp) / "gemma3"))
        cpu.init_cpu_process_group()
        app, _ = cpu.load_on_cpu(model_dir, {"tp_degree": 1}, dtype="float32", seq_len=len(TOKENS) + 1,
                                 model_class=family.model_class)
        actual = cpu.prefix_logits(app, TOKENS, PROMPT_LEN)
        reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            expected = reference(torch.tensor([TOKENS])).logits[0, PROMPT_LEN - 1:].float()
    agree = int((actual.argmax(-1) == expected.argmax(-1)).sum())
    worst = float((actual - expected).abs().max())
    accepted = agree == len(expected) and worst <= MAX_ABS
    detail = f"{agree} of {len(expected)} top-1 tokens agree, max |dlogit| {worst:.2g} (NxDI's CPU run, float32)"
    out.write_text(json.dumps(asdict(Verdict(accepted, detail))))


if __name__ == "__main__":
    run_judge(sys.argv[1], Path(sys.argv[2]))
