"""Handoff modes, chosen by name in the config: whether the RLD hands its backlog to the MD all at
once (one-shot: RLD freed soonest, the MD's one extend step is a visible stall) or in parts while it
keeps decoding (catch-up: several small stalls, the RLD works longer)."""
from __future__ import annotations

from pddsim.config import Pdd


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


HANDOFFS = {"one_shot": OneShot, "catch_up": CatchUp, "adaptive": Adaptive}
