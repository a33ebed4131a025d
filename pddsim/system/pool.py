"""A pool of instances of one role, with what routers need of it kept current so a routing
decision costs the same in a pool of 4 or of 1,024: the instances ordered by queued work then KV
load (a heap), and which instances' prefix caches hold a block (that map only from the first
time a router asks for it: pools small enough to scan never do, and keeping it costs a step per
block every cache gains or loses).

Queued work changes only when an instance's state does, and the instance says so (it marks itself
in `changed` before any callback and before it waits; see `Instance.load_watch`); the heap is
brought up to date lazily, at the next pick. KV load also grows between those marks, while a
decode run is under way (a router sees the iterations run so far), and never shrinks there: the
heap keys it by a lower bound (the load without the run under way, `Instance.kv_load_floor`), and a
pick computes the exact load of the few instances whose bound could still win (and re-keys them by
it). A pick is therefore the same as a scan of the pool's list (`routers.least_loaded`): least
work, then least KV load, then the first.
"""
from __future__ import annotations

from functools import partial
from heapq import heapify, heappop, heappush
from typing import Iterable

from pddsim.engine.instance import Instance


class Pool(list):
    """The instances of one role in service (a list, in order), with their `PoolIndex`. An
    instance joins with `add`, at its place in the pool's order (not necessarily the end: one
    coming back after a failure goes where it was), and leaves with `remove`."""

    def __init__(self, instances: Iterable[Instance] = ()):
        super().__init__()
        self.routing = PoolIndex()
        for inst in instances:
            self.add(inst)

    def add(self, inst: Instance) -> None:
        pos, position = self.routing.join(inst), self.routing.position
        if not self or position(self[-1]) < pos:
            super().append(inst)
        else:
            self.insert(sum(1 for other in self if position(other) < pos), inst)

    def remove(self, inst: Instance) -> None:
        super().remove(inst)
        self.routing.leave(inst)


class PoolIndex:
    """A pool's members (every instance it ever had, in order) by (queued work, KV load,
    position), and block -> positions of the members whose cache holds it (from the first
    `holders`); the members out of service are left out of both."""

    def __init__(self):
        self.members: list[Instance] = []
        self._pos: dict[Instance, int] = {}
        self._heap: list[tuple[int, int, int]] = []     # (queued, a floor of the KV load, pos)
        self._entry: list[tuple[int, int, int] | None] = []  # each member's live heap entry
        self.changed: dict[Instance, None] = {}          # members marked since the last pick
        # block -> the positions holding it, as the bits of an int: a million blocks held as sets
        # would be a million objects for the cyclic garbage collector to walk, run after run.
        # None until a router first asks; the caches' hooks keep it current from then on.
        self._holders: dict[int, int] | None = None

    # -- what routers ask -----------------------------------------------------------------------
    def least(self, skip: frozenset[int] | set[int] = frozenset()) -> tuple[int, int, int] | None:
        """(queued work, KV load, position) of the least loaded instance, those at positions in
        `skip` aside (None if none is left): least queued work, then least KV load now, then the
        first in the pool."""
        self._refresh()
        heap, entry, members = self._heap, self._entry, self.members
        best: tuple[int, int, int] | None = None
        taken = []
        while heap:
            e = heap[0]
            q, lo, pos = e
            if entry[pos] is not e:                      # superseded: drop it
                heappop(heap)
                continue
            if best is not None and (q, lo, pos) > best:  # nothing further can beat `best`
                break
            heappop(heap)
            if pos not in skip:
                load = members[pos].kv_load
                if load != lo:                           # grew in a decode run: re-key it
                    e = entry[pos] = (q, load, pos)
                if best is None or e < best:
                    best = e
            taken.append(e)
        for e in taken:
            heappush(heap, e)
        return best

    def holders(self, block: int) -> set[int]:
        """Positions of the members in service whose cache holds `block`."""
        self._refresh()
        if self._holders is None:
            self._holders = {}
            for pos, inst in enumerate(self.members):
                if self._entry[pos] is not None:         # in service
                    self._index_cache(inst, pos)
        mask, found = self._holders.get(block, 0), set()
        while mask:
            low = mask & -mask
            found.add(low.bit_length() - 1)
            mask ^= low
        return found

    def position(self, inst: Instance) -> int:
        return self._pos[inst]

    # -- members joining, leaving and returning ------------------------------------------------------
    def join(self, inst: Instance) -> int:
        """`inst` is in service (new, or back with its cache emptied or replaced); its position."""
        pos = self._pos.get(inst)
        if pos is None:
            pos = self._pos[inst] = len(self.members)
            self.members.append(inst)
            self._entry.append(None)
        self._watch(inst, pos)
        return pos

    def leave(self, inst: Instance) -> None:
        """`inst` takes no new work until it joins again: picks skip it, whatever its cache holds."""
        self._refresh()
        pos = self._pos[inst]
        self._entry[pos] = None
        inst.load_watch = None
        self.changed.pop(inst, None)
        if inst.cache is not None and self._holders is not None:
            self._removed(pos, inst.cache.blocks())
            inst.cache.on_added = inst.cache.on_removed = None

    # -- internals ----------------------------------------------------------------------------------
    def _refresh(self) -> None:
        changed = self.changed
        if not changed:
            return
        heap, entry, pos_of = self._heap, self._entry, self._pos
        for inst in changed:
            pos = pos_of[inst]
            e = (inst.queued_tokens, inst.kv_load_floor, pos)
            if e != entry[pos]:
                entry[pos] = e
                heappush(heap, e)
        changed.clear()
        if len(heap) > 4 * len(entry) + 64:              # mostly superseded entries: rebuild
            heap[:] = [e for e in entry if e is not None]
            heapify(heap)

    def _watch(self, inst: Instance, pos: int) -> None:
        inst.load_watch = self.changed
        self.changed[inst] = None
        if self._holders is not None:
            self._index_cache(inst, pos)

    def _index_cache(self, inst: Instance, pos: int) -> None:
        """Add what the member at `pos` holds to the block map, and keep it there."""
        cache = inst.cache
        if cache is None:
            return
        cache.on_added, cache.on_removed = partial(self._added, pos), partial(self._removed, pos)
        self._added(pos, cache.blocks())

    def _added(self, pos: int, blocks: Iterable[int]) -> None:
        holders, bit = self._holders, 1 << pos
        assert holders is not None                       # hooks are set once it is built
        for block in blocks:
            holders[block] = holders.get(block, 0) | bit

    def _removed(self, pos: int, blocks: Iterable[int]) -> None:
        holders, keep = self._holders, ~(1 << pos)
        assert holders is not None
        for block in blocks:
            mask = holders.get(block)
            if mask is not None:
                mask &= keep
                if mask:
                    holders[block] = mask
                else:
                    del holders[block]
