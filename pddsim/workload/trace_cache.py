"""Parsed traces kept on disk, so that a large agent trace is decompressed, decoded and checked once.

An entry is bytes stored under a key the reader derives from the trace file's SHA-256 and the reader's
own version; it lives in `$PDDSIM_CACHE_DIR/traces` (default `~/.cache/pddsim/traces`). Each entry
carries the SHA-256 of its payload, so an entry that was cut short or edited is a miss, never a wrong
result; it is written whole and then renamed into place, so a run killed mid-write leaves no half entry
and concurrent runs never read one. A cache that cannot be read or written is said once on stderr and
the trace is read as if there were no cache.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from pathlib import Path

ENV = "PDDSIM_CACHE_DIR"
_said: set[str] = set()


def directory() -> Path:
    return Path(os.environ.get(ENV) or Path.home() / ".cache" / "pddsim") / "traces"


def key(*parts: bytes) -> str:
    """The hex SHA-256 of `parts`, each length-prefixed so that no two splits of the same bytes collide."""
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def load(name: str) -> bytes | None:
    """The payload stored under `name`, or None: absent, unreadable or not what was written."""
    path = directory() / name
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):     # no such entry (the latter: nor such a folder)
        return None
    except OSError as e:
        _say("unreadable", f"cannot read trace cache entry {path} ({e.strerror}); reading the trace")
        return None
    digest, _, payload = data.partition(b"\n")
    if digest != hashlib.sha256(payload).hexdigest().encode():
        _say("damaged", f"trace cache entry {path} is damaged; reading the trace")
        return None
    return payload


def store(name: str, payload: bytes) -> None:
    path = directory() / name
    tmp = path.with_name(f"{name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
        os.replace(tmp, path)
    except OSError as e:
        _say("unwritable", f"cannot write the trace cache in {path.parent} ({e.strerror}); "
                           "traces are read uncached")
        with contextlib.suppress(OSError):
            tmp.unlink()


def damaged(name: str, why: str) -> None:
    """An entry whose checksum holds but whose content the reader cannot use (a miss, said once)."""
    _say("damaged", f"trace cache entry {directory() / name} is unusable ({why}); reading the trace")


def _say(kind: str, message: str) -> None:
    """Each kind of trouble once per process: a cache that cannot be written is not news per file."""
    if kind not in _said:
        _said.add(kind)
        print(f"pddsim: note: {message}", file=sys.stderr)
