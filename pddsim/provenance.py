"""What produced an output, written beside it: the package version, the command line, the
resolved config and its hash, the trace and its SHA-256, the seed and the catalog entries used,
so a summary or a table found later says how to make it again.

Everything but `run_info` (the date and the wall time) is the same for the same invocation on the
same files, so two identical runs differ in `run_info` alone.
"""
from __future__ import annotations

import hashlib
import json
import shlex
import sys
from contextvars import ContextVar
from datetime import datetime, timezone
from functools import cache
from pathlib import Path

from pddsim.config import Config
from pddsim.version import __version__

# the command line of the CLI invocation under way (`cli.main` sets it; the Python API leaves it
# empty and the process's own argv stands in)
COMMAND: ContextVar[str] = ContextVar("command", default="")


def config_sha256(cfg: Config) -> str:
    """SHA-256 of the resolved config as canonical JSON: equal hashes, equal scenarios."""
    text = json.dumps(cfg.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@cache
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    """A file's SHA-256, once per process for a file unchanged (a capacity search writes many
    outputs of one trace)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """A file's SHA-256; a directory's over its files' relative names and contents, in order."""
    if path.is_dir():
        digest = hashlib.sha256()
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(f"{f.relative_to(path).as_posix()}\0{file_sha256(f)}\n".encode())
        return digest.hexdigest()
    stat = path.stat()
    return _sha256(path.resolve(), stat.st_size, stat.st_mtime_ns)


def trace_of(cfg: Config) -> dict | None:
    """The trace a config replays, by path and SHA-256; None for a generated workload (its
    generator and seed are in the config)."""
    if cfg.workload.trace is None:
        return None
    path = cfg.resolve(cfg.workload.trace).resolve()
    return {"path": str(path), "sha256": file_sha256(path)}


def command_line() -> str:
    return COMMAND.get() or shlex.join(sys.argv)


def run_info(wall_s: float | None = None) -> dict:
    """What differs between two identical runs: when, and how long it took here."""
    info: dict = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if wall_s is not None:
        info["wall_s"] = wall_s
    return info


def provenance(cfg: Config, seed: int | None = None, wall_s: float | None = None,
               **extra) -> dict:
    """The provenance of an output made from `cfg` at `seed` (None: the config's); `extra`:
    what else the command was given (a plan's dimensions, a bathtub's stream...)."""
    return {"pddsim": __version__, "command": command_line(),
            "seed": cfg.seed if seed is None else seed, "trace": trace_of(cfg),
            "catalog": cfg.catalog_used(), "config_sha256": config_sha256(cfg),
            **extra, "config": cfg.model_dump(mode="json"), "run_info": run_info(wall_s)}


def write(prov: dict, path: Path) -> None:
    path.write_text(json.dumps(prov, indent=2) + "\n")
