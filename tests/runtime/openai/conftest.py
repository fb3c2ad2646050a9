import pytest


@pytest.fixture(scope="session")
def harmony_encodings(tmp_path_factory):
    """openai-harmony's vocabulary offline: o200k_base.tiktoken rebuilt from quicktok-v1's copy (sha256 checked) and
    named by TIKTOKEN_ENCODINGS_BASE for the session, as a user on a machine without internet would set it."""
    from tests.helpers.harmony_vocab import o200k_base_dir

    pytest.importorskip("openai_harmony", reason="openai-harmony is not installed (pyproject's dependency)")
    directory = o200k_base_dir(tmp_path_factory.mktemp("tiktoken-encodings"))
    if directory is None:
        pytest.skip("quicktok-v1 is not installed: it ships the o200k vocabulary harmony reads offline (dev extra)")
    patch = pytest.MonkeyPatch()
    patch.setenv("TIKTOKEN_ENCODINGS_BASE", str(directory))
    yield directory
    patch.undo()


@pytest.fixture(scope="session")
def harmony_encoding(harmony_encodings):
    from neuronpack.runtime.openai.harmony import load_encoding

    return load_encoding()
