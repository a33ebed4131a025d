"""Routing policies: which instance of a pool serves a request. Chosen by name in the config."""
from __future__ import annotations

from itertools import count
from typing import Protocol, Sequence

from pddsim.engine.instance import Instance
from pddsim.engine.request import Request


class Router(Protocol):
    """The seam of a routing policy (`policies.*_router` in the config)."""

    def pick(self, instances: Sequence[Instance], req: Request) -> Instance: ...


class CacheAffinity:
    """Least queued work, this request's uncached tokens included: a session's next turn goes where
    its prefix is cached unless that instance is backed up by more than the cache saves. On a
    decode-side pool with a decode-side cache this keeps a session on the decoder that holds its
    prefix (MD and P caches aligned) until that decoder runs out of memory and queues."""

    def pick(self, instances, req):
        return min(instances, key=lambda i: (i.queued_tokens + req.input_tokens - i.cached_tokens(req),
                                             i.kv_load))


class LeastLoaded:
    """Least queued work, then least KV in use."""

    def pick(self, instances, req):
        return min(instances, key=lambda i: (i.queued_tokens, i.kv_load))


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
