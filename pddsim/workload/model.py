"""What a workload is once read: requests, each with its prefix-hash chain and session position.

Every reader and generator produces a `Workload`; the simulator consumes nothing else. Its
requests are held as columns (`TraceTable`): a million generated requests held ~280 MB as
objects for the whole run, as columns ~85 MB; a request reads as a `TraceRequest`, made when it is
read.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence, overload

import numpy as np

from pddsim.engine.chain import BlockIds

# The latest simulated time (s) the clock, a float, resolves to a microsecond (~272 years): a
# workload replayed past it would have its latencies rounded away.
CLOCK_LIMIT_S = 2.0 ** 33


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
    hash_ids: BlockIds = ()
    block_tokens: int = 512
    session_id: int = -1
    think_s: float = 0.0
    follows: int = -1


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


class FlatIds(Sequence[tuple[int, ...]]):
    """Chains of arbitrary ids, all in one array: chain i is `ids[offsets[i]:offsets[i + 1]]`,
    read as a tuple. A generator's few ids a request cost 8 bytes each here, where tuples of them
    cost ~120 bytes a request."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray):
        self.ids = array("q", np.ascontiguousarray(ids, dtype=np.int64).tobytes())
        self.offsets = array("q", np.ascontiguousarray(offsets, dtype=np.int64).tobytes())

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, i: int) -> tuple[int, ...]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[int, ...]]: ...

    def __getitem__(self, i: int | slice) -> tuple[int, ...] | list[tuple[int, ...]]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        return tuple(self.ids[self.offsets[i]:self.offsets[i + 1]])


def _numbers(typecode: str, values, n: int) -> array:
    """`values` (an array-like of n, or one value for all) as a typed array."""
    dtype = np.float64 if typecode == "d" else np.int64
    given = np.broadcast_to(np.asarray(values, dtype=dtype), (n,))
    return array(typecode, np.ascontiguousarray(given).tobytes())


class TraceTable(Sequence[TraceRequest]):
    """The requests as columns, one per `TraceRequest` field: numbers in typed arrays (each read
    as a Python number, or as a numpy array without a copy by `column`), chains as a sequence of
    their own (a list, or `FlatIds`). Reading request i makes its `TraceRequest`."""

    def __init__(self, arrival_s, input_tokens, output_tokens, hash_ids: Sequence[BlockIds],
                 block_tokens, session_id=-1, think_s=0.0, follows=-1):
        """Each number column an array-like of one value a request, or one value for all."""
        n = len(hash_ids)
        self.arrival_s = _numbers("d", arrival_s, n)
        self.input_tokens = _numbers("q", input_tokens, n)
        self.output_tokens = _numbers("q", output_tokens, n)
        self.hash_ids = hash_ids
        self.block_tokens = _numbers("q", block_tokens, n)
        self.session_id = _numbers("q", session_id, n)
        self.think_s = _numbers("d", think_s, n)
        self.follows = _numbers("q", follows, n)

    @classmethod
    def of(cls, rows: Iterable[TraceRequest]) -> TraceTable:
        """The table of `rows`, in their order (their chains kept as they are)."""
        rows = list(rows)

        def col(name: str) -> list:
            return [getattr(r, name) for r in rows]
        return cls(col("arrival_s"), col("input_tokens"), col("output_tokens"),
                   col("hash_ids"), col("block_tokens"), col("session_id"), col("think_s"),
                   col("follows"))

    def column(self, name: str) -> np.ndarray:
        """A number field of every request, as a (read-only) array over the column itself."""
        values = getattr(self, name)
        out = np.frombuffer(values, dtype=np.float64 if values.typecode == "d" else np.int64)
        out.flags.writeable = False
        return out

    def __len__(self) -> int:
        return len(self.hash_ids)

    @overload
    def __getitem__(self, i: int) -> TraceRequest: ...

    @overload
    def __getitem__(self, i: slice) -> list[TraceRequest]: ...

    def __getitem__(self, i: int | slice) -> TraceRequest | list[TraceRequest]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        return TraceRequest(self.arrival_s[i], self.input_tokens[i], self.output_tokens[i],
                            self.hash_ids[i], self.block_tokens[i], self.session_id[i],
                            self.think_s[i], self.follows[i])

    def __iter__(self) -> Iterator[TraceRequest]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        """Equal to a table or a list with the same requests in the same order."""
        if not isinstance(other, (TraceTable, list)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None         # type: ignore[assignment]   # compared by content, as a list is


@dataclass(slots=True)
class Workload:
    """Requests sorted by arrival; a session's requests appear in their order within the session.
    A benchmark's requests carry no arrivals: its `clients` issue them. Requests given as a list
    are kept as a `TraceTable`."""

    requests: TraceTable
    source: str = "synthetic"
    sessions: int = 0
    extra: dict = field(default_factory=dict)
    clients: Clients | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.requests, TraceTable):
            self.requests = TraceTable.of(self.requests)

    @property
    def warmup(self) -> int:
        """Requests issued first and left out of the run's figures."""
        return self.clients.warmup if self.clients is not None else 0

    def __len__(self) -> int:
        return len(self.requests)
