"""The request log reader: JSON lines and CSV with OpenAI's usage names; only prompt_tokens required; anything else
is one TrafficError naming the line, never another exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuronpack.errors import TrafficError
from neuronpack.traffic import FIELDS, TrafficRecord, read_traffic


def test_jsonl_and_csv_read_the_same_records(tmp_path):
    records = [TrafficRecord(412, 64, 384, 8, 1767225600.25, 1767225600.5, 1767225601.75), TrafficRecord(20)]
    jsonl = tmp_path / "log.jsonl"
    jsonl.write_text("\n".join(r.to_json_line() for r in records) + "\n\n")
    csv = tmp_path / "log.csv"
    csv.write_text(",".join(FIELDS) + ",model\n" + "412,64,384,8,1767225600.25,1767225600.5,1767225601.75,x\n"
                   + "20,,,,,,,\n")
    assert read_traffic(jsonl).records == read_traffic(csv).records == tuple(records)
    assert read_traffic(jsonl).format == "jsonl" and read_traffic(csv).format == "csv"


def test_unknown_keys_are_ignored_and_extension_less_files_are_sniffed(tmp_path):
    log = tmp_path / "requests.log"
    log.write_text(json.dumps({"prompt_tokens": 7, "id": "r1", "usage": {"x": 1}}) + "\n")
    assert read_traffic(log).records == (TrafficRecord(7),)
    log.write_text("completion_tokens,prompt_tokens\n5,9\n")
    assert read_traffic(log).records == (TrafficRecord(9, 5),)


@pytest.mark.parametrize(("text", "name", "message"), [
    ("", "log.jsonl", "holds no requests"),
    ("\n\n", "log.jsonl", "holds no requests"),
    ("prompt_tokens\n", "log.csv", "holds no requests"),
    ('{"prompt_tokens": 5}\n{"completion_tokens": 3}\n', "log.jsonl", "prompt_tokens is missing .*line 2"),
    ('{"prompt_tokens": 0}\n', "log.jsonl", "prompt_tokens is 0; it must be at least 1"),
    ('{"prompt_tokens": true}\n', "log.jsonl", "not a whole number"),
    ('{"prompt_tokens": 5.5}\n', "log.jsonl", "not a whole number"),
    ('{"prompt_tokens": 5, "cached_tokens": 6}\n', "log.jsonl", "cached_tokens 6 is more than prompt_tokens 5"),
    ('{"prompt_tokens": 5, "arrived_at": "noon"}\n', "log.jsonl", "arrived_at is not a time"),
    ("[1, 2]\n", "log.jsonl", "not a JSON object but list"),
    ("{oops\n", "log.jsonl", "not a JSON object: .*line 1"),
    ("completion_tokens\n4\n", "log.csv", "no prompt_tokens column"),
    ("prompt_tokens\nabc\n", "log.csv", "'abc', not a whole number .*line 2"),
    ("prompt_tokens\n5,6\n", "log.csv", "2 cells under a header of 1"),
])
def test_bad_logs_are_one_clear_error(tmp_path, text, name, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TrafficError, match=message):
        read_traffic(path)


def test_unreadable_inputs(tmp_path):
    with pytest.raises(TrafficError, match="not found"):
        read_traffic(tmp_path / "missing.jsonl")
    with pytest.raises(TrafficError, match="is a directory"):
        read_traffic(tmp_path)
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TrafficError, match="not UTF-8"):
        read_traffic(tmp_path / "bin.jsonl")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(["log.jsonl", "log.csv", "log"]))
def test_garbage_bytes_never_crash(tmp_path_factory, data, name):
    path = tmp_path_factory.mktemp("fuzz") / name
    path.write_bytes(data)
    try:
        traffic = read_traffic(path)
    except TrafficError as exc:
        assert "\n" not in exc.one_line()
    else:
        assert traffic.records and all(r.prompt_tokens >= 1 for r in traffic.records)


values = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=8),
                   st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from([*FIELDS, "other"]), values, max_size=8), min_size=1, max_size=5))
def test_json_records_of_any_shape_never_crash(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("fuzz") / "log.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows))
    try:
        read_traffic(path)
    except TrafficError:
        pass
