"""Graph reuse on the Neuron frameworks, with the test stand-in SDK counting compiler runs (0 on reuse):

- nxd: the traced model (model.pt, NEFFs inside) is the donor's; neuron_config.json is saved again and the weights
  sharded again through NxDI's own ``shard_weights`` (compile() minus the trace, as NxDI 0.9's application_base.py
  splits it); the sharded weights are the new checkpoint's. NxDI's CPU run of such an artifact is in
  tests/upstream/test_nxdi_eval.py.
- tnx: TNx's saved NEFFs take the weights as inputs at to_neuron() (transformers_neuronx/base.py: load() then
  to_neuron(), NEFFs matched by HLO hash): neffs/ is the donor's, nothing is compiled.
- vneuron: tests/backends/vneuron/test_pod.py holds a fine-tune's carried-over entries to vllm-neuron 0.21's own code.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from neuronpack.pipeline import compile_model, verify_artifact
from tests.backends.neuron_standin import fixtures as standin
from tests.helpers.tiny_models import fine_tune_copy

pytestmark = pytest.mark.contract
nxd_sdk, tnx_sdk, sdk_path = standin.nxd_sdk, standin.tnx_sdk, standin.sdk_path  # fixtures
TINY_NXD = ["target.framework=nxd", "target.instance=inf2", "target.tp_degree=2", "target.batch_size=2",
            "target.seq_len=256", "target.max_context_length=128", "model.dtype=float32"]
TINY_TNX = ["target.framework=tnx", "target.instance=inf2", "target.tp_degree=2", "target.batch_size=2",
            "target.seq_len=512", "target.max_context_length=256"]


@pytest.mark.parametrize("sets", [[], ['quantization.dtype="int8"']], ids=["bf16", "int8"])
def test_nxd_reuses_the_traced_model_and_shards_the_new_weights(tiny_llama, tmp_path, nxd_sdk, sets):
    root = tmp_path / "root"
    donor = compile_model(str(tiny_llama), overrides=[*TINY_NXD, *sets], out_root=root)
    assert len(nxd_sdk.events("compile")) == 1
    nxd_sdk.CALLS.clear()
    tuned = fine_tune_copy(tiny_llama, tmp_path / "fine-tune")
    reused = compile_model(str(tuned), overrides=[*TINY_NXD, *sets], out_root=root)
    assert nxd_sdk.events("compile") == []  # no trace, no neuronx-cc
    (shard,) = nxd_sdk.events("shard_weights")
    source = reused.manifest.model.path  # the checkpoint sharded: the fine-tune, or its quantized copy
    assert shard["model_path"] == source.rstrip("/") + "/"
    assert source == str(tuned) if not sets else source != donor.manifest.model.path
    assert reused.graphs_from["key"] == donor.key and reused.graphs_from["files"] == 1
    assert (reused.path / "model.pt").stat().st_ino == (donor.path / "model.pt").stat().st_ino
    # neuron_config.json names this checkpoint (the quantized copy of the fine-tune), not the donor's
    mine = reused.manifest.compile_config["neuron_config"]
    if sets:
        assert mine["quantized_checkpoints_path"] != donor.manifest.compile_config["neuron_config"][
            "quantized_checkpoints_path"]
    # each rank's shard holds the new checkpoint's rows
    checkpoint = {k: v for f in sorted(Path(source).glob("*.safetensors")) for k, v in load_file(f).items()}
    for rank in range(2):
        new = load_file(reused.path / "weights" / f"tp{rank}_sharded_checkpoint.safetensors")
        old = load_file(donor.path / "weights" / f"tp{rank}_sharded_checkpoint.safetensors")
        assert new.keys() == old.keys() == checkpoint.keys()
        name = "model.layers.0.mlp.down_proj.weight"
        rows = checkpoint[name].shape[0] // 2
        assert torch.equal(new[name], checkpoint[name][rank * rows:(rank + 1) * rows])
        assert not torch.equal(new[name], old[name])
    assert verify_artifact(reused.path).key == reused.key


def test_nxd_without_shard_weights_compiles_instead(tiny_llama, tmp_path, nxd_sdk, monkeypatch):
    from neuronx_distributed_inference.models.application_base import NeuronApplicationBase

    root = tmp_path / "root"
    compile_model(str(tiny_llama), overrides=TINY_NXD, out_root=root)
    monkeypatch.delattr(NeuronApplicationBase, "shard_weights")  # an NxDI older than the split (0.9 has it)
    monkeypatch.setattr(NeuronApplicationBase, "compile", _compile_without_split(NeuronApplicationBase.compile))
    nxd_sdk.CALLS.clear()
    reused = compile_model(str(fine_tune_copy(tiny_llama, tmp_path / "ft")), overrides=TINY_NXD, out_root=root)
    assert reused.graphs_from is None and len(nxd_sdk.events("compile")) == 1


def _compile_without_split(compile_fn):
    def compile(self, path, *args, **kwargs):
        self.shard_weights = lambda p, *a, **k: type(self)._shard_checkpoint(self, f"{p}/weights")
        return compile_fn(self, path, *args, **kwargs)

    return compile


def test_tnx_reuses_the_neffs_and_compiles_nothing(tiny_llama, tmp_path, tnx_sdk):
    root = tmp_path / "root"
    donor = compile_model(str(tiny_llama), overrides=TINY_TNX, out_root=root)
    assert len(tnx_sdk.events("cpu_compile")) == 1
    tnx_sdk.CALLS.clear()
    reused = compile_model(str(fine_tune_copy(tiny_llama, tmp_path / "ft")), overrides=TINY_TNX, out_root=root)
    assert tnx_sdk.CALLS == []  # not even from_pretrained: TNx reads the weights at to_neuron() on the server
    neffs = sorted(p.name for p in (donor.path / "neffs").iterdir())
    assert reused.graphs_from == {**reused.graphs_from, "key": donor.key, "files": len(neffs)}
    assert sorted(p.name for p in (reused.path / "neffs").iterdir()) == neffs
    assert verify_artifact(reused.path).key == reused.key
