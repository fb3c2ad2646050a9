"""The exact Neuron SDK / vLLM pairings neuronpack targets, and which one a machine (or an artifact) belongs to.

One declared table (docs/neuron.md shows the same). Versions are matched by prefix: ``"0.9."`` matches NxDI
0.9.0 and 0.9.17334. ``None`` in a column means the pairing does not pin that package. Sources: AWS Neuron release
notes (component index pages for SDK 2.24-2.29), vllm-project/vllm-neuron release 0.4.1 / 0.5.0
(requirements/core.txt: vllm==0.13.0 / vllm==0.16.0, NxDI >= 0.7), aws-neuron/upstreaming-to-vllm tag 2.24.0 and
NxDI's own setup pins.

Example::

    installed = {"neuronx-distributed-inference": "0.9.17334", "vllm": "0.16.0", "vllm-neuron": "0.5.0"}
    pairing_of(installed).name        # "sdk-2.29-vllm-neuron-0.5"
"""

from __future__ import annotations

from dataclasses import dataclass

from neuronpack.backends.neuron.common import version_tuple
from neuronpack.backends.neuron.packages import dist_version

BUILD_DISTS = ("neuronx-distributed-inference", "neuronx-cc", "torch-neuronx")  # what an NxDI artifact is built with
CLASSIC_PLUGIN = ((0, 2), (0, 6))  # vllm-neuron releases that load NxDI artifacts: 0.2 <= version < 0.6
SERVING_DISTS = ("neuronx-distributed-inference", "neuronx-cc", "torch-neuronx", "transformers", "vllm", "vllm-neuron",
                 "libtorch-neuronx-lite")


@dataclass(frozen=True)
class Pairing:
    name: str
    sdk: str  # Neuron SDK release
    target: str  # serving target: "vllm-v0" | "vllm-neuron"
    versions: dict[str, str | tuple[str, ...] | None]  # dist -> version prefix(es) (None: not pinned)
    note: str = ""
    refused: str = ""  # set: a stack neuronpack knowingly builds nothing for: why, and what to do instead

    def matches(self, installed: dict[str, str | None], dists: tuple[str, ...] = SERVING_DISTS, *,
                missing_ok: bool = False) -> bool:
        """Every pinned dist in ``dists`` installed at a matching version (``missing_ok``: absent ones pass)."""
        for dist in dists:
            want = self.versions.get(dist)
            have = installed.get(dist)
            if want is None or (missing_ok and (not have or have == "absent")):
                continue
            if not have or have == "absent" or not _starts(have, want):
                return False
        return True

    def to_dict(self) -> dict:
        versions = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.versions.items()}
        return {"name": self.name, "sdk": self.sdk, "target": self.target, "versions": versions, "note": self.note,
                "refused": self.refused}


PAIRINGS: tuple[Pairing, ...] = (
    Pairing("sdk-2.24-fork-v0", "2.24", "vllm-v0",
            {"neuronx-distributed-inference": "0.4.", "neuronx-cc": None, "torch-neuronx": None,
             "transformers": None, "vllm": "0.7.", "vllm-neuron": None},
            "aws-neuron/upstreaming-to-vllm tag 2.24.0 (vLLM 0.7.2 base, V0; the released multi-node launcher)"),
    Pairing("vllm-0.9-v0", "2.23-2.24", "vllm-v0",
            {"neuronx-distributed-inference": ("0.3.", "0.4."), "neuronx-cc": None, "torch-neuronx": None,
             "transformers": None, "vllm": "0.9.", "vllm-neuron": None},
            "vLLM mainline 0.9.x, V0 Neuron worker (shipped with NxDI 0.3 / 0.4); single node only"),
    Pairing("sdk-2.28-vllm-neuron-0.4", "2.28", "vllm-neuron",
            {"neuronx-distributed-inference": "0.8.", "neuronx-cc": None, "torch-neuronx": None,
             "transformers": None, "vllm": "0.13.", "vllm-neuron": "0.4."},
            "vllm-project/vllm-neuron 0.4.1 (vLLM 0.13.0, V1 'classic' plugin on NxDI 0.8.16251)"),
    Pairing("sdk-2.29-vllm-neuron-0.5", "2.29", "vllm-neuron",
            {"neuronx-distributed-inference": "0.9.", "neuronx-cc": "2.24.", "torch-neuronx": "2.9.",
             "transformers": "4.57.", "vllm": "0.16.", "vllm-neuron": "0.5."},
            "vllm-project/vllm-neuron 0.5.0 (vLLM 0.16.0) on NxDI 0.9.17334, neuronx-cc 2.24.5133.0, torch-neuronx "
            "2.9.0.2.13; still the recommended path for Inf2 / Trn1"),
    # The SDK 2.31+ vLLM Neuron plugin (framework vneuron): its own models and compile cache, no NxDI. Only the plugin
    # and vLLM pins are declared (its release pins vllm==0.21.0 / vllm==0.24.0); the compiler / torch-neuronx
    # versions of those SDKs could not be read here, and the artifact's recorded versions are checked one by one.
    Pairing("sdk-2.31-vllm-neuron-0.21", "2.31", "vneuron",
            {"vllm": "0.21.", "vllm-neuron": "0.21."},
            "vllm-neuron 0.21.0.1.0.0 (vLLM 0.21), the torch.compile plugin for Trn2 / Trn3: framework vneuron"),
    Pairing("sdk-2.32-vllm-neuron-0.24", "2.32", "vneuron",
            {"vllm": "0.24.", "vllm-neuron": "0.24.", "libtorch-neuronx-lite": None},
            "vllm-neuron 0.24.0.1.1.0 (vLLM 0.24, cache code in libtorch-neuronx-lite, NxDI absent from the images): "
            "framework vneuron"),
    # SDK 2.33 (Oct 2026, beta). AWS's docs (guides/how-to-choose-compilation-route.md, how-to-precompile-cache.md,
    # design/compilation/how_vllm_is_integrated_with_torchneuron.md at v2.33.0) make the native route the default and
    # give no entry layout, metadata or CPU-compile output for it; SDK 2.34 (GA, multi-LoRA) names no plugin version.
    Pairing("sdk-2.33-vllm-neuron-0.29", "2.33", "vneuron", {"vllm-neuron": "0.29."},
            "vllm-neuron 0.29 (SDK 2.33, beta): native route (AOTAutograd -> torch-mlir -> StableHLO) by default",
            refused="vllm-neuron 0.29 compiles through its native route by default, and neither its docs nor any "
                    "source readable here say what its CPU compile leaves in the compile cache on that route (which "
                    "files an entry holds, which metadata its loader reads); its Precompile Cache is off in CPU mode "
                    "and on only when VLLM_NEURON_BACKEND is set. neuronpack packages only entries a loader was shown "
                    "to read. Build vneuron artifacts with vllm-neuron 0.21 or 0.24 (SDK 2.31 / 2.32 images), or "
                    "let a 0.29 pod compile at its first start"),
)


def installed_versions() -> dict[str, str | None]:
    """The serving stack on this machine, from package metadata only (no imports)."""
    return {dist: dist_version(dist) for dist in SERVING_DISTS}


def pairing_of(installed: dict[str, str | None], *, target: str | None = None) -> Pairing | None:
    """The declared pairing this set of versions belongs to (optionally for one serving target), or None. A refused
    pairing is returned too (``refused`` says why): the caller refuses it by name."""
    for pairing in PAIRINGS:
        if (target is None or pairing.target == target) and pairing.matches(installed):
            return pairing
    return None


def pairings_for_build(built: dict[str, str], target: str) -> list[Pairing]:
    """The pairings of ``target`` whose NxDI / compiler / torch-neuronx pins admit an artifact's recorded build
    versions (a version the manifest does not record is not held against it)."""
    return [p for p in PAIRINGS if p.target == target and p.matches(built, BUILD_DISTS, missing_ok=True)]


def describe(installed: dict[str, str | None]) -> str:
    """``"neuronx-distributed-inference 0.9.17334, vllm 0.16.0, ..."`` (installed packages only)."""
    parts = [f"{d} {v}" for d, v in installed.items() if v and v != "absent"]
    return ", ".join(parts) or "no Neuron serving packages"


def _starts(version: str, prefixes: str | tuple[str, ...]) -> bool:
    options = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(version == p.rstrip(".") or version.startswith(p) for p in options)


def is_new_plugin(plugin_version: str | None) -> bool:
    """Whether a vllm-neuron version is the SDK 2.31+ "vLLM Neuron" plugin (0.21.0.1.0.0, 0.24.0.1.1.0, ...), not the
    classic NxDI one (0.2 - 0.5)."""
    if not plugin_version:
        return False
    parts = version_tuple(plugin_version)
    return not (len(parts) <= 4 and CLASSIC_PLUGIN[0] <= parts[:2] < CLASSIC_PLUGIN[1])
