"""What a workload is once read: requests, each with its prefix-hash chain and session position.

Every reader and generator produces a `Workload`; the simulator consumes nothing else.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from itertools import chain
from typing import Any, overload

import numpy as np

# The latest simulated time (s) the clock, a float, resolves to a microsecond (~272 years): a
# workload replayed past it would have its latencies rounded away.
CLOCK_LIMIT_S = 2.0 ** 33

_BLOCK = 4096          # requests turned into Python objects at a time when iterating


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request as the trace gives it.

    `hash_ids[i]` identifies the prefix up to block i (equal id => equal prefix); a block holds
    `block_tokens` tokens. `arrival_s` is the recorded (open-loop) arrival; replay keeps a
    session's requests at their offsets from its first one and may move the session's start
    (Poisson or concurrency-driven starts, a time scale). Closed-loop replay sends a request
    `think_s` after the request it `follows` (an index into the workload) has finished streaming; a
    request that follows none starts its session. Sub-agents are requests that follow a parent's
    request, so a session is a small dependency tree, not only a chain.
    """

    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()
    block_tokens: int = 512
    session_id: int = -1
    think_s: float = 0.0
    follows: int = -1


_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(TraceRequest)}
_FLOATS = ("arrival_s", "think_s")


def _exact(values: list, kind: type) -> np.ndarray:
    """`values` as a float64 or int64 column when every one is a `kind` it holds; otherwise as
    the objects themselves (an int past 64 bits, an arrival given as an int), so that a request
    reads back exactly what it was built with."""
    if all(type(v) is kind for v in values):
        try:
            return np.array(values, dtype=np.float64 if kind is float else np.int64)
        except OverflowError:
            pass
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


class RequestColumns(Sequence[TraceRequest]):
    """A workload's requests held as columns, one array per `TraceRequest` field, the hash chains
    as one flat array (request i's: `hash_ids[hash_bounds[i]:hash_bounds[i + 1]]`). A million
    requests as objects took ~280 MB; as columns, ~60 MB. `[i]` builds the request's
    `TraceRequest` (Python ints and floats, the chain a tuple), for the one request a caller
    handles; a loop over one field of every request reads its column instead. Read-only: the
    arrays cannot be written. A column given as a scalar is that value for every request (a
    broadcast view, no memory)."""

    __slots__ = ("arrival_s", "input_tokens", "output_tokens", "hash_ids", "hash_bounds",
                 "block_tokens", "session_id", "think_s", "follows")
    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_ids: np.ndarray
    hash_bounds: np.ndarray
    block_tokens: np.ndarray
    session_id: np.ndarray
    think_s: np.ndarray
    follows: np.ndarray

    def __init__(self, arrival_s: np.ndarray, input_tokens: np.ndarray, output_tokens: np.ndarray,
                 hash_ids: np.ndarray, hash_bounds: np.ndarray,
                 block_tokens: np.ndarray | int = _DEFAULTS["block_tokens"],
                 session_id: np.ndarray | int = _DEFAULTS["session_id"],
                 think_s: np.ndarray | float = _DEFAULTS["think_s"],
                 follows: np.ndarray | int = _DEFAULTS["follows"]) -> None:
        n = len(arrival_s)
        for name, value in (("arrival_s", arrival_s), ("input_tokens", input_tokens),
                            ("output_tokens", output_tokens), ("hash_ids", hash_ids),
                            ("hash_bounds", hash_bounds), ("block_tokens", block_tokens),
                            ("session_id", session_id), ("think_s", think_s), ("follows", follows)):
            if isinstance(value, np.ndarray):
                column = value.view()
            else:
                column = np.broadcast_to(np.float64(value) if name in _FLOATS else np.int64(value), n)
            column.flags.writeable = False
            setattr(self, name, column)

    @classmethod
    def of(cls, requests: Sequence[TraceRequest]) -> RequestColumns:
        """The columns of `requests` (readers and tests build lists of objects)."""
        def column(name: str) -> np.ndarray:
            kind = float if name in _FLOATS else int
            return _exact([getattr(r, name) for r in requests], kind)
        lengths = np.fromiter((len(r.hash_ids) for r in requests), dtype=np.int64,
                              count=len(requests))
        return cls(column("arrival_s"), column("input_tokens"), column("output_tokens"),
                   _exact(list(chain.from_iterable(r.hash_ids for r in requests)), int),
                   np.concatenate(([0], np.cumsum(lengths))), column("block_tokens"),
                   column("session_id"), column("think_s"), column("follows"))

    def __len__(self) -> int:
        return len(self.arrival_s)

    @overload
    def __getitem__(self, i: int) -> TraceRequest: ...

    @overload
    def __getitem__(self, i: slice) -> RequestColumns: ...

    def __getitem__(self, i: int | slice) -> TraceRequest | RequestColumns:
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"request {i} of {n}")
        i %= n
        return TraceRequest(self.arrival_s.item(i), self.input_tokens.item(i),
                            self.output_tokens.item(i),
                            tuple(self.hash_ids[self.hash_bounds[i]:self.hash_bounds[i + 1]].tolist()),
                            self.block_tokens.item(i), self.session_id.item(i),
                            self.think_s.item(i), self.follows.item(i))

    def take(self, index: np.ndarray) -> RequestColumns:
        """The requests at `index` (positions), in its order."""
        lengths = np.diff(self.hash_bounds)[index]
        bounds = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        # each picked chain's ids: its old start, then consecutive positions
        at = np.repeat(self.hash_bounds[:-1][index] - bounds[:-1], lengths) + np.arange(bounds[-1])
        return RequestColumns(self.arrival_s[index], self.input_tokens[index],
                              self.output_tokens[index], self.hash_ids[at], bounds,
                              self.block_tokens[index], self.session_id[index], self.think_s[index],
                              self.follows[index])

    def rows(self) -> Iterator[tuple[float, int, int, tuple[int, ...], int, int, float, int]]:
        """Each request's fields as a tuple in `TraceRequest`'s order, read a block at a time:
        a pass over a million requests holds a block of Python objects, not a million."""
        for lo in range(0, len(self), _BLOCK):
            hi = min(lo + _BLOCK, len(self))
            ids = self.hash_ids[self.hash_bounds[lo]:self.hash_bounds[hi]].tolist()
            cuts = (self.hash_bounds[lo:hi + 1] - self.hash_bounds[lo]).tolist()
            yield from zip(self.arrival_s[lo:hi].tolist(), self.input_tokens[lo:hi].tolist(),
                           self.output_tokens[lo:hi].tolist(),
                           [tuple(ids[a:b]) for a, b in zip(cuts, cuts[1:])],
                           self.block_tokens[lo:hi].tolist(), self.session_id[lo:hi].tolist(),
                           self.think_s[lo:hi].tolist(), self.follows[lo:hi].tolist())

    def __iter__(self) -> Iterator[TraceRequest]:
        return (TraceRequest(*row) for row in self.rows())

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence of the same requests (a list of them, as readers build)."""
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __repr__(self) -> str:
        """As the list of its requests: a workload's repr does not depend on how it is held."""
        return repr(list(self))

    def sessions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sessions in order of first appearance, a request without a session one of its own:
        (each request's session, the requests grouped by session in order, each session's bounds
        in that grouping: session s is `members[bounds[s]:bounds[s + 1]]`). Arrays, not a list
        per session: a million independent requests are a million sessions."""
        n = len(self)
        ids = self.session_id
        keys = np.where(ids >= 0, ids, -1 - np.arange(n, dtype=np.int64))
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        rank = np.empty(len(first), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        session_of = rank[inverse]
        members = np.argsort(session_of, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(np.bincount(session_of, minlength=len(first)))))
        return session_of, members, bounds.astype(np.int64)


@dataclass(frozen=True, slots=True)
class Clients:
    """A fixed-concurrency benchmark's load: `concurrency` clients issue the requests in order,
    each its next one `think_s` after its previous one ended; the first `warmup` are a phase of
    their own (left out of the figures), the rest start once all of them have ended; each
    phase's clients start evenly over `ramp_s`."""

    concurrency: int
    warmup: int = 0
    ramp_s: float = 0.0
    think_s: float = 0.0


@dataclass(slots=True, init=False)
class Workload:
    """Requests sorted by arrival; a session's requests appear in their order within the session.
    A benchmark's requests carry no arrivals: its `clients` issue them. Built from any sequence of
    requests (readers build lists), held as `RequestColumns`."""

    requests: RequestColumns
    source: str
    sessions: int
    extra: dict
    clients: Clients | None

    def __init__(self, requests: Sequence[TraceRequest], source: str = "synthetic", sessions: int = 0,
                 extra: dict | None = None, clients: Clients | None = None) -> None:
        self.requests = requests if isinstance(requests, RequestColumns) else RequestColumns.of(requests)
        self.source = source
        self.sessions = sessions
        self.extra = {} if extra is None else extra
        self.clients = clients

    @property
    def warmup(self) -> int:
        """Requests issued first and left out of the run's figures."""
        return self.clients.warmup if self.clients is not None else 0

    def __len__(self) -> int:
        return len(self.requests)
