"""Result cache: finished runs on disk, keyed by everything that determines them, so an interrupted
plan or sweep resumes with only the missing runs.

A key hashes what was measured (the task's name), the resolved config, the workload's requests,
the seed and the package version; so a changed config, trace or simulator never reuses a stale
result. Each result is one JSON file, written whole and then renamed into place: a run killed
mid-write leaves no half file behind.
"""
from __future__ import annotations

import hashlib
import json
import os
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


class ResultCache:
    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"--cache {directory}: cannot create ({e.strerror})") from None

    @staticmethod
    def key(task: str, cfg: Config, workload: str, seed: int) -> str:
        """`workload` is the workload's digest (computed once, shared by the points that use it)."""
        return _digest([task, cfg.model_dump(mode="json"), workload, seed, __version__])

    def get(self, key: str) -> dict | None:
        try:
            return json.loads((self.dir / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None

    def put(self, key: str, value: dict) -> None:
        path = self.dir / f"{key}.json"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(value))
        os.replace(tmp, path)
