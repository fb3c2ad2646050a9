import uuid
from pathlib import Path

import pytest

from tests.helpers.moto_s3 import MotoServer


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory, tiny_llama) -> Path:
    """The tiny serving artifact (export-only graphs): the same key and root as tests/runtime's, built once."""
    from tests.runtime.serving import build_artifact

    return build_artifact(tiny_llama, tmp_path_factory.getbasetemp() / "serve-root")


@pytest.fixture(scope="session")
def moto_server():
    """A real S3 server (moto) on 127.0.0.1, one per test session."""
    with MotoServer() as server:
        yield server


def use_s3(server: MotoServer, monkeypatch, *, endpoint_in_env: bool = True) -> str:
    """Point boto3's standard configuration at ``server`` (as a user's environment would) and return a fresh
    s3://bucket/prefix store URL."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret-never-printed")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    if endpoint_in_env:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    else:
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    bucket = f"np-{uuid.uuid4().hex[:12]}"
    server.create_bucket(bucket)
    return f"s3://{bucket}/ci/artifacts"


@pytest.fixture
def s3_store(moto_server, monkeypatch) -> str:
    return use_s3(moto_server, monkeypatch)


@pytest.fixture(params=["s3", "file"])
def any_store(request, moto_server, monkeypatch, tmp_path) -> str:
    """Each test using this runs against both transports."""
    if request.param == "s3":
        return use_s3(moto_server, monkeypatch)
    return f"file://{tmp_path / 'shared-store'}"
