"""The request log: what a server records per request, and the one reader of it (``neuronpack buckets plan``).

Format (docs/buckets.md, "The request log"): JSON lines, one object per request, or a CSV file with a header row of
the same column names. Names follow OpenAI's ``usage`` object; only ``prompt_tokens`` is required, any other key or
column is ignored (a gateway's own fields, a request id, the model name):

- ``prompt_tokens``: tokens of the prompt (int >= 1);
- ``completion_tokens``: tokens generated (int >= 0);
- ``cached_tokens``: prompt tokens served from a prefix cache (OpenAI's ``prompt_tokens_details.cached_tokens``;
  int, 0..prompt_tokens);
- ``batch``: sequences decoding together while this request decoded (int >= 1; the server writes the mean over the
  request's decode steps, rounded);
- ``arrived_at``, ``first_token_at``, ``finished_at``: Unix seconds (numbers);
- ``prompt``: the prompt's text, written by ``serve --request-log-prompts`` only (the reader leaves it out).

Example::

    >>> record = TrafficRecord(prompt_tokens=412, completion_tokens=64, cached_tokens=384, batch=8)
    >>> record.to_json_line()
    '{"batch": 8, "cached_tokens": 384, "completion_tokens": 64, "prompt_tokens": 412}'
    >>> read_traffic(Path("requests.jsonl")).records[0].prompt_tokens   # doctest: +SKIP
    412
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from neuronpack.errors import TrafficError
from neuronpack.text import control_character_problem

COUNT_FIELDS = ("prompt_tokens", "completion_tokens", "cached_tokens", "batch")
TIME_FIELDS = ("arrived_at", "first_token_at", "finished_at")
FIELDS = COUNT_FIELDS + TIME_FIELDS
_MINIMUM = {"prompt_tokens": 1, "completion_tokens": 0, "cached_tokens": 0, "batch": 1}
_FIX = 'write one request per line, e.g. {"prompt_tokens": 412, "completion_tokens": 64} (see docs/buckets.md)'


@dataclass(frozen=True)
class TrafficRecord:
    """One request of the log."""

    prompt_tokens: int
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    batch: int | None = None
    arrived_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    prompt: str | None = None  # written on request only (serve --request-log-prompts); never read back

    def to_dict(self) -> dict:
        """The record as the log stores it: the fields that are set, nothing else."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def to_json_line(self) -> str:
        """One line of the JSON-lines log (keys sorted, no newline)."""
        return json.dumps(self.to_dict(), sort_keys=True)


@dataclass(frozen=True)
class Traffic:
    """Every request of a log, in file order."""

    records: tuple[TrafficRecord, ...]
    path: str
    format: str  # "jsonl" or "csv"


def read_traffic(path: Path) -> Traffic:
    """Read a JSON-lines or CSV request log (by extension: ``.csv`` is CSV, ``.jsonl`` / ``.ndjson`` / ``.json`` JSON
    lines; otherwise a first character ``{`` means JSON lines). TrafficError names the line and field of the first
    problem; an empty log is refused."""
    path = Path(path)
    text = _read_text(path)
    kind = _kind(path, text)
    records = tuple(_read_jsonl(text, str(path)) if kind == "jsonl" else _read_csv(text, str(path)))
    if not records:
        raise TrafficError("the request log holds no requests", where=str(path), fix=_FIX)
    return Traffic(records, str(path), kind)


def parse_record(data: dict, where: str) -> TrafficRecord:
    """A TrafficRecord from one request's fields (JSON values, or CSV strings: an empty cell is a missing value)."""
    values: dict = {}
    for name in FIELDS:
        raw = data.get(name)
        if raw is None or raw == "":
            continue
        values[name] = _count(raw, name, where) if name in COUNT_FIELDS else _seconds(raw, name, where)
    if "prompt_tokens" not in values:
        raise TrafficError("prompt_tokens is missing", where=where, fix=_FIX)
    cached = values.get("cached_tokens")
    if cached is not None and cached > values["prompt_tokens"]:
        raise TrafficError(f"cached_tokens {cached} is more than prompt_tokens {values['prompt_tokens']}",
                           where=where, fix="cached_tokens counts prompt tokens served from the cache")
    return TrafficRecord(**values)


# --- private ---------------------------------------------------------------------------------------------------------
def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise TrafficError("request log not found", where=str(path), fix="pass an existing file to --traffic") from None
    except IsADirectoryError:
        raise TrafficError("request log is a directory", where=str(path), fix="pass a .jsonl or .csv file") from None
    except UnicodeDecodeError:
        raise TrafficError("request log is not UTF-8 text", where=str(path),
                           fix="give JSON lines or CSV in UTF-8 (a compressed log must be unpacked first)") from None
    except OSError as exc:
        raise TrafficError(f"cannot read the request log: {exc.strerror or exc}", where=str(path),
                           fix="pass a readable file to --traffic") from None


def _kind(path: Path, text: str) -> str:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    return "jsonl" if text.lstrip().startswith("{") else "csv"


def _read_jsonl(text: str, path: str):
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            data = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            raise TrafficError(f"not a JSON object: {reason}", where=where, fix=_FIX) from None
        if not isinstance(data, dict):
            raise TrafficError(f"not a JSON object but {type(data).__name__}", where=where, fix=_FIX)
        yield parse_record(data, where)


def _read_csv(text: str, path: str):
    try:
        rows = csv.reader(io.StringIO(text, newline=""))
        header = next(rows, None)
        if header is None:
            return
        names = [name.strip() for name in header]
        if "prompt_tokens" not in names:
            raise TrafficError("the CSV header has no prompt_tokens column", where=f"{path} line 1",
                               fix="name the columns as docs/buckets.md does: prompt_tokens,completion_tokens,...")
        for row in rows:
            if not any(cell.strip() for cell in row):
                continue
            where = f"{path} line {rows.line_num}"
            if len(row) > len(names):
                raise TrafficError(f"{len(row)} cells under a header of {len(names)}", where=where,
                                   fix="give each row the header's columns")
            yield parse_record(dict(zip(names, (cell.strip() for cell in row), strict=False)), where)
    except csv.Error as exc:
        raise TrafficError(f"malformed CSV: {exc}", where=path, fix="give a CSV file with a header row") from None


def _count(raw, name: str, where: str) -> int:
    value = raw
    if isinstance(raw, str):
        try:
            value = int(raw)
        except ValueError:
            value = None
    if isinstance(value, bool) or not isinstance(value, int):
        shown = raw if isinstance(raw, int | float | str) and not isinstance(raw, bool) else type(raw).__name__
        problem = control_character_problem(shown) if isinstance(shown, str) else None
        shown = "text with a control character" if problem else repr(shown)[:40]
        raise TrafficError(f"{name} is {shown}, not a whole number", where=where, fix=_FIX)
    if value < _MINIMUM[name]:
        raise TrafficError(f"{name} is {value}; it must be at least {_MINIMUM[name]}", where=where, fix=_FIX)
    return value


def _seconds(raw, name: str, where: str) -> float:
    try:
        value = float(raw) if isinstance(raw, str) else raw
    except ValueError:
        value = None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TrafficError(f"{name} is not a time in Unix seconds", where=where,
                           fix="write timestamps as numbers of seconds since 1970 (e.g. 1767225600.25)")
    return float(value)
