"""Trace readers: turn the traces we replay into a `Workload`.

Formats: Mooncake JSONL (also written by `write_mooncake`), Azure LLM CSV, our native JSONL (written by
`write_native`) and the agent-session JSON of kv-cache-tester (one conversation per file, possibly
xz-compressed; a directory is one workload).
A malformed entry raises `InputError` naming the file and line (or request): a request skipped in silence
would bias every number computed from the trace. The few quirks of real traces that are repaired instead
are counted in `Workload.extra["repairs"]`:

* `out` 0 (aborted agent requests): the output becomes 1 token, because prefill always emits one.
* `think_time` absent (agent requests after an unrecorded `api_time`): 0, i.e. the request is sent as soon
  as its predecessor finishes, since the gap cannot be split into response and think time.
* `api_time` absent on the request a sub-agent follows: 0, so the whole gap becomes the sub-agent's think
  time.

Agent traces hash only whole blocks (`len(hash_ids) == in // block_size`), so a request may carry one id
fewer than ceil(in / block); anything further off is an error. A completed sub-agent's `t` is when its
result came back, not when it started (its start, `t - duration_ms`, falls within a second of the end of
the parent request that launched it, and parallel sub-agents share it); an "async_launched" sub-agent has
no `duration_ms` and its `t` is its launch.

An agent file, once checked, is kept in the trace cache (`trace_cache`) under its content's SHA-256 and
this module's own: the next read of the same bytes by the same reader skips decompression, decoding and
the checks, and gives the same requests.
"""
from __future__ import annotations

import csv
import hashlib
import json
import lzma
import math
import re
from bisect import bisect_left
from collections import Counter
from dataclasses import MISSING, dataclass, fields, replace
from datetime import datetime
from functools import cache, partial
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable

import numpy as np
import orjson

from pddsim.errors import InputError
from pddsim.intmath import ceil_div
from pddsim.schema import TOO_MANY_DIGITS
from pddsim.workload import trace_cache
from pddsim.workload.model import TraceRequest, TraceTable, Workload

FORMATS = ("auto", "mooncake", "azure", "native", "agent")
MOONCAKE_BLOCK_TOKENS = 512
MS_PER_S = 1000.0
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
AGENT_SUFFIXES = (".json", ".json.xz")
_READ_ERRORS = (OSError, UnicodeDecodeError, lzma.LZMAError, EOFError)
MAX_JSON_DEPTH = 1000             # nesting the standard library's JSON decoder follows
OPENING, CLOSING = np.frombuffer(b"[{", dtype=np.uint8), np.frombuffer(b"]}", dtype=np.uint8)
MAIN_AGENT = "main"                # shared-prefix key of the top-level requests of a conversation


def read_workload(path, fmt: str = "auto", *, limit: int | None = None, shared_prefix: bool = False,
                  max_tokens: int | None = None) -> Workload:
    """Read a trace file (or a directory of agent conversations) into a `Workload`.

    `limit` keeps the first `limit` requests (agent traces: whole conversations, in file-name order, until
    `limit` requests are read). `max_tokens` clips input, then output, so that input + output fits.
    `shared_prefix` (agent traces only) makes the system and tool prompt one prefix shared by all sessions.
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise InputError(f"unknown trace format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if limit is not None and limit < 1:
        raise InputError(f"limit must be at least 1, got {limit}")
    if max_tokens is not None and max_tokens < 2:
        raise InputError(f"max_tokens must be at least 2 (one input and one output token), got {max_tokens}")
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    try:
        fmt = _detect(path) if fmt == "auto" else fmt
    except _READ_ERRORS as e:
        raise InputError(f"{path}: cannot read: {e}") from None
    if shared_prefix and fmt != "agent":
        raise InputError(f"{path}: shared_prefix applies to agent traces only, not to {fmt}")
    repairs: Counter[str] = Counter()
    try:
        if fmt == "agent":
            requests, sessions = _read_agent(path, limit, shared_prefix, repairs)
        else:
            requests = _FLAT_READERS[fmt](path, repairs)[:limit]
            sessions = len({r.session_id for r in requests} - {-1})
    except _READ_ERRORS as e:
        raise InputError(f"{path}: cannot read: {e}") from None
    if not requests:
        raise InputError(f"{path}: no requests")
    if max_tokens is not None:
        requests = [_clip(r, max_tokens) for r in requests]
    return Workload(TraceTable.of(requests), source=str(path), sessions=sessions,
                    extra={"repairs": dict(repairs)})


def write_native(workload: Workload, path) -> Path:
    """Write `workload` as native JSONL, omitting fields at their defaults; `read_workload` round-trips it."""
    path = Path(path)
    defaults = {f.name: f.default for f in fields(TraceRequest)}
    with path.open("w", encoding="utf-8") as f:
        for r in workload.requests:
            row = {k: getattr(r, k) for k, default in defaults.items() if getattr(r, k) != default}
            if "hash_ids" in row:
                row["hash_ids"] = list(r.hash_ids)
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    return path


def write_mooncake(workload: Workload, path) -> Path:
    """Write `workload` as Mooncake JSONL for open-loop tools: integer-ms arrivals, no sessions or follows,
    hash chains re-cut into 512-token blocks."""
    path = Path(path)
    for i, r in enumerate(workload.requests):
        if r.hash_ids and MOONCAKE_BLOCK_TOKENS % r.block_tokens:
            raise InputError(f"{workload.source}: request {i}: {r.block_tokens}-token hash blocks do not "
                             f"tile Mooncake's {MOONCAKE_BLOCK_TOKENS}-token ones")
    with path.open("w", encoding="utf-8") as f:
        for r in workload.requests:
            f.write(json.dumps({"timestamp": round(r.arrival_s * MS_PER_S), "input_length": r.input_tokens,
                                "output_length": r.output_tokens,
                                "hash_ids": _reblock(r, MOONCAKE_BLOCK_TOKENS)}) + "\n")
    return path


def _reblock(r: TraceRequest, block_tokens: int) -> tuple[int, ...]:
    """The hash chain in blocks of `block_tokens` (a multiple of the request's): each takes the id of its
    last small block, so equal ids still mean equal prefixes. A partial last block with an unhashed tail
    gets none."""
    per = block_tokens // r.block_tokens
    ids = tuple(r.hash_ids[per - 1::per])
    small_blocks = ceil_div(r.input_tokens, r.block_tokens)
    if len(r.hash_ids) == small_blocks and small_blocks % per:
        ids += (r.hash_ids[-1],)
    return ids


# ---- shared checks ------------------------------------------------------------------------------------

def _keys(obj, where: str, required, allowed=None) -> None:
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in required if k not in obj]
    if missing:
        raise InputError(f"{where}: missing {', '.join(map(repr, missing))}")
    unknown = sorted(obj.keys() - set(allowed)) if allowed is not None else ()
    if unknown:
        raise InputError(f"{where}: unknown field {', '.join(map(repr, unknown))}")


def _int(obj: dict, key: str, where: str, minimum: int = 0) -> int:
    v = obj[key]
    if type(v) is not int:
        raise InputError(f"{where}: {key!r} must be an integer, got {v!r}")
    if v < minimum:
        raise InputError(f"{where}: {key!r} must be >= {minimum}, got {v}")
    return v


def _number(obj: dict, key: str, where: str) -> float:
    v = obj[key]
    if type(v) not in (int, float) or not math.isfinite(v) or v < 0:
        raise InputError(f"{where}: {key!r} must be a non-negative number, got {v!r}")
    return float(v)


def _maybe_number(obj: dict, key: str, where: str) -> float | None:
    """An optional number: None when absent or null (real traces leave some timings out)."""
    return None if obj.get(key) is None else _number(obj, key, where)


def _ids(obj: dict, key: str, where: str) -> tuple[int, ...]:
    v = obj[key]
    if type(v) is not list or not set(map(type, v)) <= {int}:
        raise InputError(f"{where}: {key!r} must be a list of integers")
    return tuple(v)


def _request(where: str, repairs: Counter, hashes_required: bool = True, **kw) -> TraceRequest:
    """Build a request, rejecting an empty prompt or a hash chain that does not cover the prompt."""
    r = TraceRequest(**kw)
    if r.input_tokens < 1:
        raise InputError(f"{where}: input of 0 tokens")
    if r.hash_ids or hashes_required:
        blocks = ceil_div(r.input_tokens, r.block_tokens)
        if not blocks - 1 <= len(r.hash_ids) <= blocks:
            raise InputError(f"{where}: {len(r.hash_ids)} hash ids for {r.input_tokens} input tokens in "
                             f"blocks of {r.block_tokens} (expected {blocks}, or {blocks - 1} when the last "
                             f"block is partial)")
    if r.output_tokens == 0:
        repairs["output 0 -> 1 token"] += 1
        r = replace(r, output_tokens=1)
    return r


def _clip(r: TraceRequest, max_tokens: int) -> TraceRequest:
    """Cut the prompt first, then the output, to fit `max_tokens`; both keep at least one token."""
    if r.input_tokens + r.output_tokens <= max_tokens:
        return r
    input_tokens = max(1, max_tokens - r.output_tokens)
    blocks = ceil_div(input_tokens, r.block_tokens)
    return replace(r, input_tokens=input_tokens, output_tokens=max_tokens - input_tokens,
                   hash_ids=r.hash_ids[:blocks])


def _open(path: Path, binary: bool = False):
    if path.suffix == ".xz":
        return lzma.open(path, "rb") if binary else lzma.open(path, "rt", encoding="utf-8")
    return path.open("rb") if binary else path.open(encoding="utf-8")


def _detect(path: Path) -> str:
    if path.is_dir():
        return "agent"
    name = path.name.removesuffix(".xz")
    if name.endswith(".csv"):
        return "azure"
    if name.endswith(".json"):
        return "agent"
    if name.endswith(".jsonl"):
        objects = _jsonl(path)
        first: dict = next(objects, (None, {}))[1]
        objects.close()
        if "timestamp" in first:
            return "mooncake"
        if "arrival_s" in first:
            return "native"
    raise InputError(f"{path}: cannot tell the trace format; name it (mooncake, azure, native or agent)")


# ---- flat traces ---------------------------------------------------------------------------------------

def _jsonl(path: Path):
    """Yield (where, object) for each non-empty line."""
    with _open(path, binary=True) as f:      # decoded line by line, to name a bad line
        for lineno, raw in enumerate(f, 1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise InputError(f"{where}: not UTF-8 text") from None
            if not line.strip():
                continue
            obj = _parse_json(line, where)
            _keys(obj, where, ())
            yield where, obj


def _parse_json(text: str, where: str):
    """JSON text as Python objects; malformed text, an integer of more digits than Python converts
    (4,300) or nesting deeper than the decoder's stack are one InputError line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:        # a JSONL line's `where` names the line already
        detail = e if "\n" in text.rstrip() else e.msg
        raise InputError(f"{where}: bad JSON: {detail}") from None
    except ValueError:                       # the only other: an integer past the digit limit
        raise InputError(f"{where}: bad JSON: {TOO_MANY_DIGITS}") from None
    except RecursionError:
        raise InputError(f"{where}: bad JSON: nested too deep") from None


def _by_arrival(requests: list[TraceRequest]) -> list[TraceRequest]:
    """Stable sort: traces whose timestamps go backwards are replayed in time order, ties in file order."""
    return sorted(requests, key=attrgetter("arrival_s"))


_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


def _read_mooncake(path: Path, repairs: Counter) -> list[TraceRequest]:
    requests: list[TraceRequest] = []
    for where, obj in _jsonl(path):
        _keys(obj, where, _MOONCAKE_KEYS, _MOONCAKE_KEYS)
        requests.append(_request(
            where, repairs, arrival_s=_number(obj, "timestamp", where) / MS_PER_S,
            input_tokens=_int(obj, "input_length", where), output_tokens=_int(obj, "output_length", where),
            hash_ids=_ids(obj, "hash_ids", where), block_tokens=MOONCAKE_BLOCK_TOKENS))
    return _by_arrival(requests)


_NATIVE_FIELDS: dict[str, Callable[[dict, str, str], Any]] = {
    "arrival_s": _number, "input_tokens": _int, "output_tokens": _int, "hash_ids": _ids,
    "block_tokens": partial(_int, minimum=1), "session_id": partial(_int, minimum=-1),
    "think_s": _number, "follows": partial(_int, minimum=-1),
}
_NATIVE_REQUIRED = tuple(f.name for f in fields(TraceRequest) if f.default is MISSING)


def _read_native(path: Path, repairs: Counter) -> list[TraceRequest]:
    """Native traces without sessions are sorted by arrival; with sessions, file order is kept."""
    requests: list[TraceRequest] = []
    for where, obj in _jsonl(path):
        _keys(obj, where, _NATIVE_REQUIRED, _NATIVE_FIELDS)
        kw = {k: read(obj, k, where) for k, read in _NATIVE_FIELDS.items() if k in obj}
        if kw.get("follows", -1) >= len(requests):
            raise InputError(f"{where}: 'follows' must name an earlier request, got {kw['follows']}")
        requests.append(_request(where, repairs, hashes_required=False, **kw))
    flat = all(r.session_id == -1 and r.follows == -1 for r in requests)
    return _by_arrival(requests) if flat else requests


def _read_azure(path: Path, repairs: Counter) -> list[TraceRequest]:
    """Arrivals are seconds since the earliest row; the fraction is parsed apart (it has 7 digits).
    Counts and stamps are ASCII digits, and every stamp names a time zone or none does."""
    rows = []
    with _open(path) as f:
        reader = csv.reader(f)
        try:
            header = next(reader, [])
            for row in reader:
                if not row:
                    continue
                where = f"{path}:{reader.line_num}"
                rows.append((*_azure_row(dict(zip(header, row)), where), where))
        except csv.Error as e:
            raise InputError(f"{path}:{reader.line_num}: bad CSV: {e}") from None
    if not rows:
        return []
    aware = rows[0][0].tzinfo is not None
    for stamp, *_, where in rows:
        if (stamp.tzinfo is not None) != aware:
            raise InputError(f"{where}: TIMESTAMP {'lacks' if aware else 'has'} a time zone, "
                             f"unlike {rows[0][-1]}'s")
    stamp0, fraction0 = min(row[:2] for row in rows)
    return _by_arrival([
        _request(where, repairs, hashes_required=False, input_tokens=context, output_tokens=generated,
                 arrival_s=(stamp - stamp0).total_seconds() + fraction - fraction0)
        for stamp, fraction, context, generated, where in rows])


_ASCII_INT = re.compile(r"-?[0-9]+")


def _azure_row(obj: dict, where: str) -> tuple[datetime, float, int, int]:
    """(stamp to the second, its fraction, context tokens, generated tokens) of one row."""
    _keys(obj, where, AZURE_COLUMNS)
    whole, _, fraction = obj["TIMESTAMP"].partition(".")
    try:
        stamp = datetime.fromisoformat(whole) if whole.isascii() else None
    except ValueError:
        stamp = None
    if stamp is None or fraction and not (fraction.isascii() and fraction.isdigit()):
        raise InputError(f"{where}: bad TIMESTAMP {obj['TIMESTAMP']!r}")
    counts = {k: int(obj[k]) if _ASCII_INT.fullmatch(obj[k].strip()) else obj[k]
              for k in AZURE_COLUMNS[1:]}
    return (stamp, float("0." + (fraction or "0")), _int(counts, "ContextTokens", where),
            _int(counts, "GeneratedTokens", where))


_FLAT_READERS = {"mooncake": _read_mooncake, "native": _read_native, "azure": _read_azure}


# ---- agent sessions ------------------------------------------------------------------------------------

class _Ids:
    """Hands out fresh global hash ids, so that blocks of different files never match by accident."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, n: int) -> range:
        self.next += n
        return range(self.next - n, self.next)


@dataclass(slots=True)
class _Row:
    """An agent request before its hash ids are made global and its session is ordered."""

    where: str
    arrival_s: float
    input_tokens: int
    output_tokens: int
    local_ids: tuple[int, ...]
    prefix: tuple[str, int]             # (shared-prefix key, number of leading blocks it covers)
    think_s: float
    follows: int                        # index into the conversation's rows
    api_s: float | None


class _Conversation:
    """One agent-session file: the main agent's chain of requests plus the chains of its sub-agents,
    parsed from the file's JSON document or restored from the trace cache's entry of it."""

    def __init__(self, file: Path, shared_prefix: bool) -> None:
        self.file, self.shared_prefix = file, shared_prefix
        self.repairs: Counter[str] = Counter()       # this file's; the reader adds them up
        self.block = 0
        self.rows: list[_Row] = []

    def parse(self, doc) -> None:
        _keys(doc, str(self.file), ("block_size", "requests"))
        self.block = _int(doc, "block_size", str(self.file), minimum=1)
        self._chain(doc, str(self.file), "", 0.0, None, MAIN_AGENT)
        if not self.rows:
            raise InputError(f"{self.file}: no requests")

    def entry(self) -> bytes:
        """The parsed rows as the trace cache keeps them: a row's ids shared with the row it follows are
        kept as their count only, and its place as the label after the file name."""
        skip = len(f"{self.file}: request ")
        rows = []
        for row in self.rows:
            before = self.rows[row.follows].local_ids if row.follows >= 0 else ()
            k = len(before) if row.local_ids[:len(before)] == before else 0
            rows.append((row.where[skip:], row.arrival_s, row.input_tokens, row.output_tokens, k,
                         row.local_ids[k:], *row.prefix, row.think_s, row.follows, row.api_s))
        return orjson.dumps({"block": self.block, "repairs": dict(self.repairs), "rows": rows})

    def restore(self, payload: bytes) -> None:
        """The inverse of `entry`."""
        doc = orjson.loads(payload)
        self.block, self.repairs = doc["block"], Counter(doc["repairs"])
        prefix = f"{self.file}: request "
        for label, arrival, input_tokens, output_tokens, k, tail, key, blocks, think, follows, api \
                in doc["rows"]:
            shared = self.rows[follows].local_ids[:k] if k else ()
            self.rows.append(_Row(prefix + label, arrival, input_tokens, output_tokens,
                                  shared + tuple(tail), (key, blocks), think, follows, api))

    def _chain(self, owner: dict, owner_where: str, label: str, start_s: float, spawner: int | None,
               prefix_key: str) -> None:
        """Add the requests of `owner` (conversation or sub-agent) started at `start_s`, then its sub-agents.

        The first request follows `spawner`, each later one the previous; a sub-agent's first request follows
        the last request of this chain that started before the sub-agent did.
        """
        entries = owner["requests"]
        if type(entries) is not list:
            raise InputError(f"{owner_where}: 'requests' must be a list")
        prefix = (prefix_key, self._prefix_blocks(owner, owner_where))
        chain: list[int] = []
        subagents = []
        for i, e in enumerate(entries):
            where = f"{self.file}: request {label}{i}"
            _keys(e, where, ("t",))
            if e.get("type") == "subagent":
                subagents.append((where, f"{label}{i}.", e))
                continue
            _keys(e, where, ("in", "out", "hash_ids"))
            arrival = start_s + _number(e, "t", where)
            think = _maybe_number(e, "think_time", where)
            if chain:
                follows = chain[-1]
                if arrival < self.rows[follows].arrival_s:
                    raise InputError(f"{where}: 't' goes backwards")
            elif spawner is not None:
                follows, think = spawner, max(0.0, arrival - self._end(spawner))
            else:
                follows = -1
            if think is None:
                self.repairs["think_time missing -> 0"] += 1
                think = 0.0
            self.rows.append(_Row(where, arrival, _int(e, "in", where), _int(e, "out", where),
                                  _ids(e, "hash_ids", where), prefix, think, follows,
                                  _maybe_number(e, "api_time", where)))
            chain.append(len(self.rows) - 1)
        starts = [self.rows[j].arrival_s for j in chain]
        for where, sub_label, e in subagents:
            _keys(e, where, ("requests",))
            duration_s = (_maybe_number(e, "duration_ms", where) or 0.0) / MS_PER_S
            start = start_s + _number(e, "t", where) - duration_s
            if start < start_s:
                raise InputError(f"{where}: sub-agent 'duration_ms' exceeds its 't'")
            k = bisect_left(starts, start)
            self._chain(e, where, sub_label, start, chain[k - 1] if k else None,
                        f"subagent:{e.get('subagent_type')}")

    def _prefix_blocks(self, owner: dict, where: str) -> int:
        if not self.shared_prefix:
            return 0
        _keys(owner, where, ("system_tokens", "tool_tokens"))
        return (_int(owner, "system_tokens", where) + _int(owner, "tool_tokens", where)) // self.block

    def _end(self, j: int) -> float:
        row = self.rows[j]
        if row.api_s is None:
            self.repairs["api_time missing -> 0"] += 1
        return row.arrival_s + (row.api_s or 0.0)

    def requests(self, session_id: int, base: int, ids: _Ids,
                 shared: dict[str, tuple[int, ...]]) -> list[TraceRequest]:
        """The session's requests by arrival, numbered from `base`; a follower never precedes its leader.

        A request's chain usually extends the one it follows (an Agent context re-sent with a
        turn more): only the blocks past that shared chain are renumbered one by one."""
        rows = self.rows
        shared_with = [0] * len(rows)            # leading ids equal to those of the row followed
        local: set[int] = set()
        for j, row in enumerate(rows):           # a row follows an earlier one in this list
            if row.follows >= 0:
                before = rows[row.follows].local_ids
                if row.local_ids[:len(before)] == before:
                    shared_with[j] = len(before)
            local.update(row.local_ids[shared_with[j]:])
        remap = dict(zip(sorted(local), ids.take(len(local))))
        renumbered: list[tuple[int, ...]] = []
        for j, row in enumerate(rows):
            k = shared_with[j]
            renumbered.append((renumbered[row.follows] if k else ())
                              + tuple(map(remap.__getitem__, row.local_ids[k:])))
        order = sorted(range(len(rows)), key=lambda j: rows[j].arrival_s)
        position = {j: base + p for p, j in enumerate(order)}
        out = []
        for j in order:
            row = rows[j]
            hashes = renumbered[j]
            key, blocks = row.prefix
            if blocks:
                common = shared.get(key, ())
                if len(common) < blocks:
                    common = shared[key] = common + tuple(ids.take(blocks - len(common)))
                hashes = common[:min(blocks, len(hashes))] + hashes[blocks:]
            out.append(_request(row.where, self.repairs, arrival_s=row.arrival_s,
                                input_tokens=row.input_tokens, output_tokens=row.output_tokens,
                                hash_ids=hashes, block_tokens=self.block,
                                session_id=session_id, think_s=row.think_s,
                                follows=position[row.follows] if row.follows >= 0 else -1))
        return out


@cache
def _reader_version() -> bytes:
    """This module's own digest: any change to how a file is read or checked retires its cached entries."""
    return hashlib.sha256(Path(__file__).read_bytes()).digest()


def _conversation(file: Path, shared_prefix: bool) -> _Conversation:
    """The file's conversation, from the trace cache when it holds these bytes read by this reader."""
    try:
        raw = file.read_bytes()
    except OSError as e:
        raise InputError(f"{file}: cannot read: {e}") from None
    name = trace_cache.key(raw, _reader_version(), b"shared prefix" if shared_prefix else b"own prefix")
    payload = trace_cache.load(name)
    if payload is not None:
        conversation = _Conversation(file, shared_prefix)
        try:
            conversation.restore(payload)
            return conversation
        except (ValueError, TypeError, KeyError, IndexError) as e:
            trace_cache.damaged(name, f"{type(e).__name__}: {e}")
    conversation = _Conversation(file, shared_prefix)
    conversation.parse(_decode_json(file, raw))
    trace_cache.store(name, conversation.entry())
    return conversation


def _decode_json(file: Path, raw: bytes):
    """orjson: the same objects as the standard library's decoder, in ~60% of its time on agent
    traces. It has no nesting limit (tens of thousands of levels crash the process), so the
    standard library's is checked first."""
    try:
        text = lzma.decompress(raw) if file.suffix == ".xz" else raw
    except lzma.LZMAError as e:
        raise InputError(f"{file}: cannot read: {e}") from None
    if _json_depth(text) > MAX_JSON_DEPTH:
        raise InputError(f"{file}: bad JSON: nested too deep (more than {MAX_JSON_DEPTH} levels)")
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise InputError(f"{file}: bad JSON: {e}") from None


_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'[]{}"')
_STRING = re.compile(rb'"[^"]*"')


def _json_depth(text: bytes) -> int:
    """How deep JSON text nests (its brackets outside strings), at C speed: escaped backslashes
    and quotes go first, then everything but brackets and quotes, then the strings."""
    bare = text.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    marks = np.frombuffer(_STRING.sub(b"", bare), dtype=np.uint8)
    steps = np.isin(marks, OPENING).astype(np.int32) - np.isin(marks, CLOSING)
    return int(np.cumsum(steps).max(initial=0))


def _read_agent(path: Path, limit: int | None, shared_prefix: bool,
                repairs: Counter) -> tuple[list[TraceRequest], int]:
    """Each file is one session, in file-name order; hash ids are renumbered to be unique across files."""
    files = sorted(p for p in path.iterdir() if p.name.endswith(AGENT_SUFFIXES)) if path.is_dir() else [path]
    if not files:
        raise InputError(f"{path}: no {' or '.join('*' + s for s in AGENT_SUFFIXES)} conversation files")
    ids, shared = _Ids(), dict[str, tuple[int, ...]]()
    requests: list[TraceRequest] = []
    sessions = 0
    for file in files:
        if limit is not None and len(requests) >= limit:
            break
        try:
            conversation = _conversation(file, shared_prefix)
        except RecursionError:               # sub-agents nested deeper than the stack goes
            raise InputError(f"{file}: sub-agents nested too deep") from None
        requests += conversation.requests(sessions, len(requests), ids, shared)
        repairs.update(conversation.repairs)
        sessions += 1
    return requests, sessions
