"""Contract tests: framework selection, precedence, placeholders and the backend registry."""

from __future__ import annotations

import pytest

from neuronpack.artifacts.key import toolchain_versions
from neuronpack.backends.neuron.packages import probe_package
from neuronpack.backends.select import choose_framework, get_backend
from neuronpack.errors import NeuronpackError
from tests.backends.neuron_standin import fixtures as standin
from tests.backends.neuron_standin.fixtures import make_placeholder

pytestmark = pytest.mark.contract
nxd_sdk, sdk_path, tnx_sdk = standin.nxd_sdk, standin.sdk_path, standin.tnx_sdk  # fixtures


def test_auto_without_sdk_is_torch_and_says_why(sdk_path):
    choice = choose_framework("auto", environ={})
    assert choice.name == "torch"
    assert "neuronx-distributed-inference is not installed" in choice.reason
    assert "transformers-neuronx is not installed" in choice.reason


def test_auto_prefers_nxd_when_it_imports(nxd_sdk, sdk_path):
    sdk_path("tnx")  # both installed: NxDI wins, as in vLLM
    choice = choose_framework("auto", environ={})
    assert choice.name == "nxd"
    assert choice.reason == "auto: neuronx-distributed-inference 0.9.17334 imports"


def test_auto_falls_back_to_tnx(tnx_sdk):
    choice = choose_framework("auto", environ={})
    assert choice.name == "tnx"
    assert choice.reason.startswith("auto: transformers-neuronx 0.13.1216 imports (neuronx-distributed-inference")


@pytest.mark.parametrize("style", ["pypi", "raises"])
def test_placeholder_counts_as_absent_with_a_reason(tmp_path, sdk_path, style):
    sdk_path(make_placeholder(tmp_path, "neuronx-distributed-inference", style=style))
    status = probe_package("neuronx_distributed_inference")
    assert status.state == "placeholder"
    assert status.version == "0.1.0"
    assert "neuronx-distributed-inference 0.1.0 from PyPI is a placeholder ('WRONG PACKAGE')" in status.reason
    assert "pip.repos.neuron.amazonaws.com" in status.reason
    choice = choose_framework("auto", environ={})
    assert choice.name == "torch"
    assert "placeholder" in choice.reason


def test_placeholder_nxd_with_real_tnx_picks_tnx(tmp_path, tnx_sdk, sdk_path):
    sdk_path(make_placeholder(tmp_path, "neuronx-distributed-inference", style="pypi"))
    choice = choose_framework("auto", environ={})
    assert choice.name == "tnx"
    assert "placeholder" in choice.reason


def test_broken_module_is_reported_not_raised(tmp_path, sdk_path):
    pkg = tmp_path / "transformers_neuronx"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import a_module_that_does_not_exist\n")
    sdk_path(tmp_path)
    status = probe_package("transformers_neuronx")
    assert status.state == "broken"
    assert "No module named 'a_module_that_does_not_exist'" in status.reason


@pytest.mark.parametrize(
    ("requested", "environ", "name", "reason"),
    [
        ("nxd", {"NEURONPACK_FRAMEWORK": "torch"}, "nxd", "requested nxd explicitly"),
        ("auto", {"NEURONPACK_FRAMEWORK": "tnx", "VLLM_NEURON_FRAMEWORK": "neuronx-distributed-inference"}, "tnx",
         "NEURONPACK_FRAMEWORK=tnx"),
        ("auto", {"VLLM_NEURON_FRAMEWORK": "transformers-neuronx"}, "tnx",
         "VLLM_NEURON_FRAMEWORK=transformers-neuronx"),
        ("auto", {"VLLM_NEURON_FRAMEWORK": "neuronx-distributed-inference"}, "nxd",
         "VLLM_NEURON_FRAMEWORK=neuronx-distributed-inference"),
        (None, {"NEURONPACK_FRAMEWORK": "auto"}, "torch", None),
        ("TORCH", {}, "torch", "requested torch explicitly"),
    ],
)
def test_precedence_explicit_then_env_then_auto(sdk_path, requested, environ, name, reason):
    choice = choose_framework(requested, environ=environ)
    assert choice.name == name
    if reason is not None:
        assert choice.reason == reason


@pytest.mark.parametrize(
    ("requested", "environ", "where"),
    [
        ("neuron", {}, "--framework / target.framework"),
        ("auto", {"NEURONPACK_FRAMEWORK": "inf2"}, "NEURONPACK_FRAMEWORK"),
        ("auto", {"VLLM_NEURON_FRAMEWORK": "nxd"}, "VLLM_NEURON_FRAMEWORK"),
    ],
)
def test_bad_values_are_one_clear_error(requested, environ, where):
    with pytest.raises(NeuronpackError) as info:
        choose_framework(requested, environ=environ)
    assert info.value.where == where
    assert info.value.fix


def test_forced_framework_without_sdk_is_chosen_but_unavailable(sdk_path):
    choice = choose_framework("auto", environ={"NEURONPACK_FRAMEWORK": "nxd"})
    assert choice.name == "nxd"
    availability = get_backend("nxd").availability()
    assert not availability.ok
    assert availability.reason == "neuronx-distributed-inference is not installed"
    tnx = get_backend("tnx").availability()
    assert (tnx.ok, tnx.reason) == (False, "transformers-neuronx is not installed")


def test_nxd_without_compiler_is_unavailable(sdk_path):
    sdk_path("nxd")  # NxDI imports, neuronx-cc absent
    availability = get_backend("nxd").availability()
    assert not availability.ok
    assert availability.reason == "the Neuron compiler is absent: neuronx-cc is not installed"


def test_registry_and_versions_from_metadata(nxd_sdk):
    backend = get_backend("nxd")
    assert backend.name == "nxd" and backend.availability().ok
    versions = backend.versions()
    assert versions["neuronx-distributed-inference"] == "0.9.17334"
    assert versions["neuronx-cc"] == "2.24.5133.0"
    assert versions["torch-neuronx"] == "2.9.0.2.13.0"
    assert set(versions) == {"neuronx-distributed-inference", "neuronx-cc", "torch-neuronx"}
    assert set(toolchain_versions(backend)) == {"neuronpack", *versions}
    assert get_backend("tnx").versions()["transformers-neuronx"] == "absent"
    assert get_backend("torch").name == "torch"
    with pytest.raises(NeuronpackError):
        get_backend("jax")


def test_selection_does_not_import_torch():
    from tests.helpers.fresh_interpreter import run_fresh

    code = ("from neuronpack.backends.select import choose_framework, get_backend; "
            "c = choose_framework('auto', {}); get_backend('nxd').versions(); print(c.name)")
    out, torch_imported = run_fresh(code)
    assert out == "torch" and not torch_imported
