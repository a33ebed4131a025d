"""Result cache: finished runs on disk, keyed by everything that determines them, so an interrupted
plan or sweep resumes with only the missing runs.

A key hashes what was measured (the task's name), the config as resolved, the catalog entries it
uses (its model, GPUs and engine profiles, by content), the contents of every file it names (a
measured perf table; the trace through the workload's own digest), the workload's requests, the
seed, the package version and the simulator's own source; so a changed config, catalog, table,
trace or simulator never reuses a stale result. Each entry carries its key and a checksum of its
value: an edited or damaged one is a miss, said once. Each is one JSON file, written whole and then
renamed into place: a run killed mid-write leaves no half file behind. A cache that cannot be
written is a warning: the results stand, they are only not kept.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from contextlib import suppress
from functools import cache
from pathlib import Path

from pddsim.config import Config
from pddsim.errors import InputError
from pddsim.version import __version__
from pddsim.workload.model import Workload


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def workload_digest(workload: Workload) -> str:
    h = hashlib.sha256()
    for r in workload.requests:
        h.update(repr((r.arrival_s, r.input_tokens, r.output_tokens, r.hash_ids, r.block_tokens,
                       r.session_id, r.think_s, r.follows)).encode())
    return h.hexdigest()


@cache
def source_digest() -> str:
    """The simulator's own source: every module of the package, by path and content (a fix that
    keeps the version moves every key)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@cache
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """A file's content hash, computed once per version of it (its size and time in the key)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _files_named(cfg: Config) -> dict[str, str]:
    """The content hash of every file the config names (a perf table, a catalog), by field value;
    the trace is left to the workload's digest."""
    out: dict[str, str] = {}

    def walk(node) -> None:
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str) and node not in out and node != cfg.workload.trace:
            path = cfg.resolve(node)
            try:
                if path.is_file():
                    stat = path.stat()
                    out[node] = _file_digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns)
            except OSError:                  # not a path (a name too long for one), or unreadable
                pass

    walk(cfg.model_dump(mode="json", exclude={"base_dir", "name"}))
    return out


def _catalog_entries(cfg: Config) -> list:
    """The catalog entries the config uses (its own catalog's, bundled or brought), by content."""
    perfs = [cfg.perf, *(c.perf for c in cfg.clusters.values() if c.perf is not None)]
    return [cfg.catalog.model(cfg.model).model_dump(mode="json"),
            [cfg.catalog.gpu(c.gpu).model_dump(mode="json") for c in cfg.clusters.values()],
            [cfg.engine_profile(p).model_dump(mode="json") for p in perfs]]


def _warn(message: str) -> None:
    print(f"pddsim: warning: {message}", file=sys.stderr)


class ResultCache:
    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self._said: set[str] = set()         # what has been warned about (once each)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"--cache {directory}: cannot create ({e.strerror})") from None

    @staticmethod
    def key(task: str, cfg: Config, workload: str, seed: int) -> str:
        """`workload` is the workload's digest (computed once, shared by the points that use it)."""
        return _digest([task, cfg.model_dump(mode="json"), _catalog_entries(cfg), _files_named(cfg),
                        workload, seed, __version__, source_digest()])

    def get(self, key: str) -> dict | None:
        """The value kept under `key`; None when there is none, or when the entry is damaged or
        edited (its checksum or key does not match: said once, then re-run)."""
        path = self.dir / f"{key}.json"
        try:
            entry = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            why = f"unreadable ({e})"
        else:
            if (not isinstance(entry, dict) or entry.keys() != {"key", "sha256", "value"}
                    or not isinstance(entry["value"], dict)):
                why = "not a cache entry"
            elif entry["key"] != key or entry["sha256"] != _digest(entry["value"]):
                why = "its checksum does not match (edited or damaged)"
            else:
                return entry["value"]
        if path.name not in self._said:
            self._said.add(path.name)
            _warn(f"{path}: {why}; simulating it again")
        return None

    def put(self, key: str, value: dict) -> None:
        """Keep `value` under `key`; a failed write is a warning (said once), never an error."""
        path = self.dir / f"{key}.json"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps({"key": key, "sha256": _digest(value), "value": value}))
            os.replace(tmp, path)
        except OSError as e:
            with suppress(OSError):
                tmp.unlink(missing_ok=True)
            if "write" not in self._said:
                self._said.add("write")
                _warn(f"--cache {self.dir}: cannot keep results ({e.strerror}); they stand, "
                      "but a rerun will simulate them again")
