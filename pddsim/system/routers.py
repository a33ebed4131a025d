"""Routing policies: which instance of a pool serves a request. Chosen by name in the config."""
from __future__ import annotations

from itertools import count
from typing import Callable, Protocol, Sequence, TypeVar

from pddsim.engine.instance import Instance
from pddsim.engine.request import Request


class Router(Protocol):
    """The seam of a routing policy (`policies.*_router` in the config)."""

    def pick(self, instances: Sequence[Instance], req: Request) -> Instance: ...


SCAN_UP_TO = 16   # pools this small are scanned: cheaper than asking their index


def _index(instances: Sequence[Instance], scan_up_to: int):
    """The pool's index when it pays to ask it (a `Pool` larger than `scan_up_to`), else None."""
    return getattr(instances, "routing", None) if len(instances) > scan_up_to else None


class CacheAffinity:
    """Least queued work, this request's uncached tokens included: a session's next turn goes where
    its prefix is cached unless that instance is backed up by more than the cache saves. On a
    decode-side pool with a decode-side cache this keeps a session on the decoder that holds its
    prefix (MD and P caches aligned) until that decoder runs out of memory and queues.

    In a large `Pool`, only the instances whose cache holds the request's first block can be credited
    a hit: they are weighed one by one, the rest through the pool's index, where the least loaded
    of them is the best (a scan when most of the pool holds the block). `scan_up_to`: pools this
    small are scanned (0: every `Pool` through its index)."""

    def __init__(self, scan_up_to: int = SCAN_UP_TO):
        self.scan_up_to = scan_up_to

    def pick(self, instances, req):
        if not req.hash_ids:                  # no prefix to credit anywhere: the same order
            return least_queued(instances, self.scan_up_to)

        def work(i):
            return i.queued_tokens + req.input_tokens - i.cached_tokens(req)

        index = _index(instances, self.scan_up_to)
        if index is None:
            return least_loaded(instances, work)
        holders = index.holders(req.hash_ids[0])
        if 4 * len(holders) > len(instances):
            return least_loaded(instances, work)
        rest = index.least(skip=holders)
        candidates = sorted(holders if rest is None else {*holders, rest[2]})
        return least_loaded([index.members[p] for p in candidates], work)


class LeastLoaded:
    """Least queued work, then least KV in use (in a `Pool` larger than `scan_up_to`, from its
    index)."""

    def __init__(self, scan_up_to: int = SCAN_UP_TO):
        self.scan_up_to = scan_up_to

    def pick(self, instances, req):
        return least_queued(instances, self.scan_up_to)


def least_queued(instances: Sequence[Instance], scan_up_to: int) -> Instance:
    """Least queued work, then least KV load, then the first (from the index of a `Pool` larger
    than `scan_up_to`)."""
    index = _index(instances, scan_up_to)
    if index is None:
        return least_loaded(instances, _queued)
    best = index.least()
    assert best is not None, "routing over an empty pool"
    return index.members[best[2]]


def _queued(inst: Instance) -> int:
    return inst.queued_tokens


class Loaded(Protocol):
    """What `least_loaded` reads of an instance, besides its work."""

    @property
    def kv_load(self) -> int: ...
    @property
    def kv_load_floor(self) -> int: ...
    @property
    def kv_load_ceiling(self) -> int: ...


L = TypeVar("L", bound=Loaded)


def least_loaded(instances: Sequence[L], work: Callable[[L], int]) -> L:
    """The first instance with the least `work`, ties broken by the least KV load: the same pick
    as `min` over (work, kv_load) pairs, but the load (a search in a decode run under way) is
    only computed for instances tied on work whose load bounds do not already decide."""
    best, best_work, best_load = None, 0, None
    for inst in instances:
        w = work(inst)
        if best is None or w < best_work:
            best, best_work, best_load = inst, w, None
        elif w == best_work:
            if inst.kv_load_floor >= (best.kv_load_ceiling if best_load is None else best_load):
                continue                      # not lighter, whatever the runs under way
            if best_load is None:
                if inst.kv_load_ceiling < best.kv_load_floor:
                    best = inst                   # lighter, whatever the runs under way
                    continue
                best_load = best.kv_load
            load = inst.kv_load
            if load < best_load:
                best, best_load = inst, load
    assert best is not None, "routing over an empty pool"
    return best


class RoundRobin:
    def __init__(self):
        self._next = count()

    def pick(self, instances, req):
        return instances[next(self._next) % len(instances)]


# name -> policy; the config's Literal is checked against these names (tests/test_registries.py)
ROUTERS: dict[str, type[Router]] = {
    "cache_affinity": CacheAffinity, "least_loaded": LeastLoaded, "round_robin": RoundRobin}


def make_router(name: str) -> Router:
    """A fresh router of the named policy (the config validates the name)."""
    return ROUTERS[name]()
