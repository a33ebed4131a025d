"""Handoff modes, chosen by name in the config: whether the RLD hands its backlog to the MD all at
once (one-shot: RLD freed soonest, the MD's one extend step is a visible stall) or in parts while it
keeps decoding (catch-up: several small stalls, the RLD works longer)."""
from __future__ import annotations

from typing import Protocol, Sequence

from pddsim.config import Pdd
from pddsim.engine.instance import Instance


class Handoff(Protocol):
    """The seam of a handoff mode (`pdd.handoff` in the config): with `backlog` tokens not yet on
    the MD, hand a part over and keep decoding on the RLD (True), or hand over all and stop?"""

    def __init__(self, cfg: Pdd) -> None: ...
    def catch_up(self, relay_pool: Sequence[Instance], backlog: int) -> bool: ...


class OneShot:
    def __init__(self, cfg: Pdd):
        self.cfg = cfg

    def catch_up(self, relay_pool, backlog: int) -> bool:
        return False


class CatchUp(OneShot):
    def catch_up(self, relay_pool, backlog):
        return backlog > self.cfg.catch_up_tokens


class Adaptive(OneShot):
    """Catch-up while the RLD pool has room; one-shot when it is loaded, to free it soonest."""

    def catch_up(self, relay_pool, backlog):
        used = sum(i.kv_load for i in relay_pool)
        room = sum(i.capacity for i in relay_pool)
        return backlog > self.cfg.catch_up_tokens and used <= self.cfg.adaptive_rld_load * room


# name -> mode; the config's Literal is checked against these names (tests/test_registries.py)
HANDOFFS: dict[str, type[Handoff]] = {"one_shot": OneShot, "catch_up": CatchUp, "adaptive": Adaptive}
