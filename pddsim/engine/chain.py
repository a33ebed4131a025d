"""Prefix-hash chains: any sequence of block ids, or a `Chain` of runs of consecutive ids.

A synthetic request's chain is a prefix of an earlier chain followed by fresh ids, so it is a few
runs of consecutive ids. Held as runs, an Agent turn costs a step per run instead of a copy of
its whole context (thousands of blocks, re-sent every turn): a day of the paper's sessions held
~140 million ids as tuples. A `Chain` reads as the tuple of its ids: indexing, length, iteration,
equality and hashing agree with that tuple's, and a slice is that tuple's slice. The prefix
cache reads a few ids of a chain per node, and searches where two chains part run by run.
"""
from __future__ import annotations

from typing import Iterator, Protocol, Sequence, overload


class BlockIds(Protocol):
    """What the simulator reads of a chain (a tuple, a list, a `Chain`): its length, its ids by
    position, its slices."""

    def __len__(self) -> int: ...

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[int]: ...

    def __getitem__(self, i: int | slice) -> int | Sequence[int]: ...

    def __iter__(self) -> Iterator[int]: ...


def id_at(chain: BlockIds, i: int) -> int:
    """`chain[i]`, read natively when compiled (indexing a `BlockIds` goes through Python's
    protocol): a `Chain`'s id through its runs, a tuple's by indexing."""
    if isinstance(chain, Chain):
        return chain.at(i)
    if isinstance(chain, tuple):
        return chain[i]                 # native indexing
    return chain[i]                     # any other sequence


def parting(chain: BlockIds, shift: int, hash_ids: BlockIds, lo: int, hi: int) -> int:
    """The first position p in lo .. hi - 1 where `hash_ids[p]` differs from `chain[p + shift]`
    (hi if none), the two agreeing before lo: once two chains differ they differ on (a block id
    names its whole prefix), so a binary search finds it, or a walk over runs for two `Chain`s."""
    if isinstance(hash_ids, Chain) and isinstance(chain, Chain):
        return hash_ids.agrees_until(chain, shift, lo, hi)
    while lo < hi:
        mid = (lo + hi) // 2
        if chain[mid + shift] == hash_ids[mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo


class Chain:
    """The ids `starts[r]`, `starts[r] + 1`, ... of run r, which ends at position `ends[r]`
    (`ends` rising, the last one the chain's length). `_last` and `_last_begin` remember the run
    read last and where it begins: the prefix cache reads a chain forward, mostly within a run."""

    __slots__ = ("starts", "ends", "_last", "_last_begin")

    def __init__(self, starts: tuple[int, ...], ends: tuple[int, ...]):
        self.starts = starts
        self.ends = ends
        self._last = 0
        self._last_begin = 0

    @staticmethod
    def run(first: int, count: int) -> Chain:
        """The ids first, first + 1, ..., first + count - 1."""
        return Chain((first,), (count,)) if count > 0 else Chain((), ())

    def extended(self, keep: int, first: int, count: int) -> Chain:
        """The first `keep` ids of this chain, then `count` fresh ids from `first` on."""
        starts: tuple[int, ...] = ()
        ends: tuple[int, ...] = ()
        if keep > 0:
            r, begin = self._run(keep - 1)         # runs 0 .. r kept, the last cut at `keep`
            starts, ends = self.starts[:r + 1], self.ends[:r] + (keep,)
            if count > 0 and starts[r] + keep - begin == first:
                return Chain(starts, ends[:r] + (keep + count,))   # the fresh ids continue run r
        if count <= 0:
            return Chain(starts, ends)
        return Chain(starts + (first,), ends + (keep + count,))

    def __len__(self) -> int:
        ends = self.ends
        return ends[-1] if ends else 0

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[int, ...]: ...

    def __getitem__(self, i: int | slice) -> int | tuple[int, ...]:
        if isinstance(i, int):
            return self.at(i)
        lo, hi, step = i.indices(len(self))
        return tuple(self._listed(lo, hi)) if step == 1 else self.ids()[i]

    def at(self, i: int) -> int:
        """The id at position i (negative: from the end)."""
        if i < 0:
            i += len(self)
        r, begin = self._run(i)
        return self.starts[r] + i - begin

    def _run(self, i: int) -> tuple[int, int]:
        """The run holding position i and the position it begins at. A scan of the runs from
        the one read last (from the first if i lies before it): a chain has a few, and a scan
        costs less than a call."""
        r, begin = self._last, self._last_begin
        if i < begin:
            r, begin = 0, 0
        if i >= 0:
            ends = self.ends
            for run in range(r, len(ends)):
                end = ends[run]
                if i < end:
                    self._last, self._last_begin = run, begin
                    return run, begin
                begin = end
        raise IndexError("chain index out of range")

    def agrees_until(self, other: Chain, shift: int, lo: int, hi: int) -> int:
        """The first position p in lo .. hi - 1 where this chain's id differs from `other`'s at
        p + `shift` (hi if none), the two agreeing before lo. A step per run: within a stretch
        where both chains run on, they agree throughout or nowhere."""
        p = lo
        while p < hi:
            r, begin = self._run(p)
            s, other_begin = other._run(p + shift)
            if self.starts[r] + p - begin != other.starts[s] + p + shift - other_begin:
                return p
            p = min(self.ends[r], other.ends[s] - shift, hi)
        return hi

    def ids(self) -> tuple[int, ...]:
        """The chain as a tuple (a step per id)."""
        return tuple(self._listed(0, len(self)))

    def _listed(self, lo: int, hi: int) -> list[int]:
        """The ids at positions lo .. hi - 1 (within the chain)."""
        out: list[int] = []
        begin = 0
        for first, end in zip(self.starts, self.ends):
            a, b = max(lo, begin), min(hi, end)
            if a < b:
                out.extend(range(first + a - begin, first + b - begin))
            begin = end
        return out

    def __iter__(self) -> Iterator[int]:
        return iter(self._listed(0, len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Chain):
            return self.starts == other.starts and self.ends == other.ends or self.ids() == other.ids()
        if isinstance(other, tuple):
            return self.ids() == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.ids())

    def __repr__(self) -> str:
        return repr(self.ids())

    def __reduce__(self) -> tuple[type, tuple[tuple[int, ...], tuple[int, ...]]]:
        return Chain, (self.starts, self.ends)     # compiled, the default would call no __init__
