"""Prefix-hash chains: any sequence of block ids, or a `Chain` of runs of consecutive ids.

A synthetic request's chain is a prefix of an earlier chain followed by fresh ids, so it is a few
runs of consecutive ids. Held as runs, an Agent turn costs a step per run instead of a copy of
its whole context (thousands of blocks, re-sent every turn): a day of the paper's sessions held
~140 million ids as tuples. A `Chain` reads as the tuple of its ids: indexing, length, iteration,
equality and hashing agree with that tuple's, and a slice is that tuple's slice. The prefix
cache reads a few ids of a chain per node, and searches where two chains part run by run.
"""
from __future__ import annotations

from bisect import bisect_right
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


class Chain:
    """The ids `starts[r]`, `starts[r] + 1`, ... of run r, which ends at position `ends[r]`
    (`ends` rising, the last one the chain's length)."""

    __slots__ = ("starts", "ends")

    def __init__(self, starts: tuple[int, ...], ends: tuple[int, ...]):
        self.starts = starts
        self.ends = ends

    @staticmethod
    def run(first: int, count: int) -> Chain:
        """The ids first, first + 1, ..., first + count - 1."""
        return Chain((first,), (count,)) if count > 0 else Chain((), ())

    def extended(self, keep: int, first: int, count: int) -> Chain:
        """The first `keep` ids of this chain, then `count` fresh ids from `first` on."""
        ends = self.ends
        r = bisect_right(ends, keep - 1) if keep > 0 else 0   # runs kept: 0 .. r (the last cut)
        starts = self.starts[:r + 1] if keep > 0 else ()
        cut = ends[:r] + (keep,) if keep > 0 else ()
        if count <= 0:
            return Chain(starts, cut)
        if starts and starts[-1] + keep - (cut[-2] if len(cut) > 1 else 0) == first:
            return Chain(starts, cut[:-1] + (keep + count,))     # the fresh ids continue the run
        return Chain(starts + (first,), cut + (keep + count,))

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
        """The id at position i (negative: from the end). A scan of the runs: a chain has a
        few, and a scan costs less than a call."""
        ends = self.ends
        n = len(ends)
        if i < 0 and n:
            i += ends[n - 1]
        begin = 0
        for r in range(n):
            end = ends[r]
            if i < end:
                if i < 0:
                    break
                return self.starts[r] + i - begin
            begin = end
        raise IndexError("chain index out of range")

    def agrees_until(self, other: Chain, shift: int, lo: int, hi: int) -> int:
        """The first position p in lo .. hi - 1 where this chain's id differs from `other`'s at
        p + `shift` (hi if none), the two agreeing before lo. A step per run: within a stretch
        where both chains run on, they agree throughout or nowhere."""
        p = lo
        while p < hi:
            r = bisect_right(self.ends, p)
            q = p + shift
            s = bisect_right(other.ends, q)
            if (self.starts[r] + p - (self.ends[r - 1] if r else 0)
                    != other.starts[s] + q - (other.ends[s - 1] if s else 0)):
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
