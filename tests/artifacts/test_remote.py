"""push / pull / ls / gc against a real S3 server (moto on 127.0.0.1) and a file:// store, through the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from neuronpack.artifacts.key import compute_key
from neuronpack.artifacts.manifest import read_manifest, write_manifest
from neuronpack.artifacts.remote import open_transport
from neuronpack.artifacts.remote.pull import fetch_manifest, pull_artifact
from neuronpack.artifacts.remote.push import push_artifact
from neuronpack.artifacts.store import artifacts_root
from neuronpack.cli.app import app
from neuronpack.errors import RemoteError
from neuronpack.pipeline import verify_artifact
from tests.artifacts.conftest import use_s3
from tests.helpers.moto_s3 import MotoServer, free_port

runner = CliRunner(env={"COLUMNS": "120"})


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def cli_json(*args) -> dict:
    result = cli(*args, "--format", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _staging_leftovers(root: Path) -> list[Path]:
    staging = artifacts_root(root) / ".staging"
    return list(staging.iterdir()) if staging.is_dir() else []


def test_push_ls_pull_roundtrip(any_store, tiny_artifact, tmp_path):
    key = tiny_artifact.name
    pushed = cli_json("push", tiny_artifact, any_store)
    assert pushed["pushed"] and pushed["key"] == key and pushed["url"] == f"{any_store}/{key}"
    again = cli_json("push", tiny_artifact, any_store)
    assert again["pushed"] is False and again["reason"] == "already in the store"

    listed = cli_json("ls", "--remote", any_store)
    assert [a["key"] for a in listed["artifacts"]] == [key] and listed["remote"] == any_store
    assert listed["artifacts"][0]["size"] == pushed["size"]
    assert key[:16] in cli("ls", "--remote", any_store).stdout

    pulled = cli_json("pull", key, "--from", any_store, "--root", tmp_path / "pod")
    path = Path(pulled["path"])
    assert pulled["installed"] and pulled["downloaded_bytes"] == pulled["size"] == pushed["size"]
    assert path == artifacts_root(tmp_path / "pod") / key
    verify_artifact(path)  # every sha256, the key, and this machine's toolchain
    for original in tiny_artifact.rglob("*"):
        if original.is_file():
            assert (path / original.relative_to(tiny_artifact)).read_bytes() == original.read_bytes()
    assert _staging_leftovers(tmp_path / "pod") == []

    text = cli("pull", key, "--from", any_store, "--root", tmp_path / "pod")
    assert text.exit_code == 0 and text.stdout.strip() == str(path) and "already installed" in text.stderr


def _tamper(store: str, key: str, rel: str, change) -> None:
    """Replace one stored object by ``change(bytes)``, behind neuronpack's back."""
    transport = open_transport(store)
    if store.startswith("file://"):
        target = transport.base / key / rel
        target.write_bytes(change(target.read_bytes()))
        return
    client = transport.client
    obj = f"{transport.prefix}/{key}/{rel}"
    body = client.get_object(Bucket=transport.bucket, Key=obj)["Body"].read()
    client.put_object(Bucket=transport.bucket, Key=obj, Body=change(body))


@pytest.mark.parametrize("change, detail", [
    (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "sha256 differs"),
    (lambda b: b + b" ", "bytes, the manifest says"),
])
def test_tampered_remote_file_is_refused_and_nothing_installed(any_store, tiny_artifact, tmp_path, change, detail):
    key = tiny_artifact.name
    cli_json("push", tiny_artifact, any_store)
    _tamper(any_store, key, "tokenizer.json", change)

    result = cli("pull", key, "--from", any_store, "--root", tmp_path, "--progress", "none")
    assert result.exit_code == 1, result.output
    assert "remote file tokenizer.json does not match the manifest" in result.stderr and detail in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not (artifacts_root(tmp_path) / key).exists() and _staging_leftovers(tmp_path) == []


def test_edited_or_unsafe_remote_manifest_is_refused(s3_store, tiny_artifact, tmp_path):
    key = tiny_artifact.name
    cli_json("push", tiny_artifact, s3_store)
    manifest = read_manifest(tiny_artifact).to_json()

    evil = {**manifest, "files": [*manifest["files"], {"path": "../../escaped.txt", "size": 1, "sha256": "0" * 64}]}
    _tamper(s3_store, key, "neuronpack.json", lambda _: json.dumps(evil).encode())
    result = cli("pull", key, "--from", s3_store, "--root", tmp_path / "r")
    assert result.exit_code == 1
    assert "'../../escaped.txt' has a '..' component: it escapes the artifact" in result.stderr
    assert not (tmp_path / "escaped.txt").exists() and not (artifacts_root(tmp_path / "r") / key).exists()

    edited = {**manifest, "key_inputs": {**manifest["key_inputs"], "neuronpack": "edited"}}
    _tamper(s3_store, key, "neuronpack.json", lambda _: json.dumps(edited).encode())
    result = cli("pull", key, "--from", s3_store, "--root", tmp_path / "r")
    assert result.exit_code == 1 and "the manifest was edited" in result.stderr


def test_two_concurrent_pulls_install_once(s3_store, tiny_artifact, tmp_path):
    key = tiny_artifact.name
    cli_json("push", tiny_artifact, s3_store)
    argv = [sys.executable, "-m", "neuronpack", "pull", key, "--from", s3_store, "--root", str(tmp_path),
            "--format", "json"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    results = [json.loads(out) for out, _ in outputs]
    assert sorted(r["installed"] for r in results) == [False, True]
    assert {r["path"] for r in results} == {str(artifacts_root(tmp_path) / key)}
    verify_artifact(artifacts_root(tmp_path) / key)
    assert _staging_leftovers(tmp_path) == []


class _StopServerReporter:
    """A progress reporter that stops the S3 server once ``after_bytes`` have arrived (mid-pull)."""

    def __init__(self, server: MotoServer, after_bytes: int) -> None:
        self.server, self.after_bytes, self.seen = server, after_bytes, 0
        self.lock = threading.Lock()

    def task(self, description, total=None, *, unit=None):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def advance(self, amount=1):
        with self.lock:
            self.seen += amount
            if self.seen > self.after_bytes:
                self.server.stop()

    def describe(self, description):
        pass

    def info(self, message):
        pass

    def warn(self, message):
        pass


def test_server_stopped_mid_pull_leaves_nothing_installed_and_next_pull_resumes(tiny_artifact, tmp_path,
                                                                                  monkeypatch):
    key = tiny_artifact.name
    final = artifacts_root(tmp_path / "pod") / key
    largest = max(e.size for e in read_manifest(tiny_artifact).files)
    with MotoServer() as first:
        transport = open_transport(use_s3(first, monkeypatch))
        push_artifact(tiny_artifact, transport)
        # One file at a time, largest first: the server dies while the second file downloads.
        with pytest.raises(RemoteError, match="cannot reach the store"):
            pull_artifact(transport, key, final, reporter=_StopServerReporter(first, largest), workers=1)
    assert not final.exists()
    assert len(_staging_leftovers(tmp_path / "pod")) == 1  # kept for the resume

    with MotoServer() as second:
        transport = open_transport(use_s3(second, monkeypatch))
        push_artifact(tiny_artifact, transport)
        resumed = pull_artifact(transport, key, final)
    assert resumed.installed and resumed.reused_files >= 1 and resumed.downloaded_bytes < resumed.size
    verify_artifact(final)
    assert _staging_leftovers(tmp_path / "pod") == []


def test_concurrent_pushes_of_one_key_commit_once(s3_store, tiny_artifact, tmp_path):
    copies = []
    for name in ("a", "b"):
        copies.append(tmp_path / name / tiny_artifact.name)
        shutil.copytree(tiny_artifact, copies[-1])
    transport = open_transport(s3_store)
    barrier = threading.Barrier(2)
    results = {}

    def push(path: Path) -> None:
        barrier.wait()
        results[path] = push_artifact(path, open_transport(s3_store))

    threads = [threading.Thread(target=push, args=(c,)) for c in copies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(r.pushed for r in results.values()) == [False, True]
    assert transport.stat(f"{tiny_artifact.name}/.push-lease") is None
    pulled = pull_artifact(transport, tiny_artifact.name, artifacts_root(tmp_path / "pod") / tiny_artifact.name)
    verify_artifact(pulled.path)


def _variant(artifact: Path, dest_root: Path, label: str) -> Path:
    """A copy of ``artifact`` as another key (its recorded inputs differ by a label): a distinct valid artifact."""
    original = read_manifest(artifact)
    key_inputs = {**original.key_inputs, "variant": label}
    manifest = original.model_copy(update={"key_inputs": key_inputs, "key": compute_key(key_inputs)})
    path = dest_root / manifest.key
    shutil.copytree(artifact, path)
    write_manifest(path, manifest)
    return path


def test_gc_remote_keeps_the_newest(any_store, tiny_artifact, tmp_path):
    keys = []
    for label in ("old", "middle", "new"):
        keys.append(cli_json("push", _variant(tiny_artifact, tmp_path, label), any_store)["key"])
        time.sleep(1.1)  # push times one second apart (S3 timestamps have second resolution)
    dry = cli_json("gc", "--remote", any_store, "--keep", "1", "--dry-run")
    assert dry["dry_run"] and sorted(r["path"] for r in dry["removed"]) == sorted(f"{any_store}/{k}" for k in keys[:2])
    listed = cli_json("ls", "--remote", any_store)["artifacts"]
    assert len(listed) == 3
    # the same artifact has the same size in ls and gc (its files; a count with the manifest differed from ls's)
    sizes = {a["url"]: a["size"] for a in listed}
    assert all(r["size"] == sizes[r["path"]] for r in dry["removed"])

    done = cli_json("gc", "--remote", any_store, "--keep", "1")
    assert {r["kind"] for r in done["removed"]} == {"artifact"} and done["freed_bytes"] > 0
    assert [a["key"] for a in cli_json("ls", "--remote", any_store)["artifacts"]] == [keys[2]]
    gone = cli("pull", keys[0], "--from", any_store, "--root", tmp_path / "pod")
    assert gone.exit_code == 1 and "is not in the remote store" in gone.stderr
    assert open_transport(any_store).list_files(keys[0]) == []


def test_gc_remote_removes_only_stale_unfinished_pushes(tmp_path):
    store = f"file://{tmp_path / 'store'}"
    stale, fresh = "a" * 64, "b" * 64
    for key in (stale, fresh):
        (tmp_path / "store" / key).mkdir(parents=True)
        (tmp_path / "store" / key / "graphs.pt2").write_bytes(b"partial")
    old = time.time() - 3600
    os.utime(tmp_path / "store" / stale / "graphs.pt2", (old, old))
    assert cli_json("ls", "--remote", store)["artifacts"] == []  # no manifest: invisible
    removed = cli_json("gc", "--remote", store)["removed"]
    assert [(r["path"], r["kind"]) for r in removed] == [(f"{store}/{stale}", "unfinished")]
    assert not (tmp_path / "store" / stale).exists() and (tmp_path / "store" / fresh).exists()


def test_remote_lookup_costs_one_request(s3_store, tiny_artifact):
    transport = open_transport(s3_store)
    requests = []
    transport.client.meta.events.register("before-send.s3", lambda request, **_: requests.append(request.url))
    assert fetch_manifest(transport, "0" * 64) is None
    assert len(requests) == 1
    push_artifact(tiny_artifact, open_transport(s3_store))
    requests.clear()
    assert fetch_manifest(transport, tiny_artifact.name).key == tiny_artifact.name
    assert len(requests) == 1


def test_endpoint_url_option_and_clear_errors_without_credentials(moto_server, monkeypatch, tiny_artifact, tmp_path):
    store = use_s3(moto_server, monkeypatch, endpoint_in_env=False)
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    assert cli_json("push", tiny_artifact, store, "--endpoint-url", moto_server.endpoint)["pushed"]
    listed = cli_json("ls", "--remote", store, "--endpoint-url", moto_server.endpoint)
    assert [a["key"] for a in listed["artifacts"]] == [tiny_artifact.name]

    bucket = store.removeprefix("s3://").split("/")[0]
    missing = cli("ls", "--remote", store.replace(bucket, "no-such-bucket-here"), "--endpoint-url",
                  moto_server.endpoint)
    assert missing.exit_code == 1 and "the bucket does not exist" in missing.stderr
    unreachable = cli("pull", tiny_artifact.name, "--from", store, "--endpoint-url",
                      f"http://127.0.0.1:{free_port()}", "--root", tmp_path, "--progress", "none")
    assert unreachable.exit_code == 1 and "cannot reach the store" in unreachable.stderr
    bad = cli("push", tiny_artifact, "ftp://example.com/x")
    assert bad.exit_code == 1 and "unsupported remote store" in bad.stderr
    for result in (missing, unreachable, bad):
        assert secret not in result.output and "testing" not in result.output
        assert len(result.stderr.strip().splitlines()) == 1


def test_progress_modes_for_pull(s3_store, tiny_artifact, tmp_path, monkeypatch):
    key = tiny_artifact.name
    cli_json("push", tiny_artifact, s3_store, "--progress", "none")
    monkeypatch.setenv("NEURONPACK_PROGRESS_INTERVAL", "0")  # every progress step prints a line
    plain = cli("pull", key, "--from", s3_store, "--root", tmp_path / "plain", "--progress", "plain")
    lines = plain.stderr.splitlines()
    assert plain.exit_code == 0 and f"pull {key[:12]}: started" in lines[0]
    assert any("MiB / " in line and "%)" in line and "/s" in line for line in lines)
    assert f"pull {key[:12]}: done in" in plain.stderr

    auto = cli("pull", key, "--from", s3_store, "--root", tmp_path / "auto")  # not a terminal: plain
    assert f"pull {key[:12]}: started" in auto.stderr
    quiet = cli("pull", key, "--from", s3_store, "--root", tmp_path / "none", "--progress", "none")
    assert quiet.exit_code == 0 and f"pull {key[:12]}" not in quiet.stderr and "pulled" in quiet.stderr


def test_pull_of_a_missing_key_and_bad_key(s3_store, tmp_path):
    missing = cli("pull", "f" * 64, "--from", s3_store, "--root", tmp_path)
    assert missing.exit_code == 1 and "is not in the remote store" in missing.stderr
    bad = cli("pull", "not-a-key", "--from", s3_store)
    assert bad.exit_code == 2
