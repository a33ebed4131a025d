"""Faults during a run (`faults:` in the config): links that go down or degrade, instances that
die and restart empty, random failures per role; and what the run keeps about them.

A link fault scales the link's capacity (0: down): flows on it get rate 0 in the link's sharing
and resume where they stopped when it comes back. Overlapping faults of one link multiply.
Without `faults` in the config nothing here exists, so a run without faults pays nothing.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from pddsim.config import Faults, LinkFault
from pddsim.system.deployment import Deployment

STALLED = "stalled"              # could make no more progress (a line or pool that never came back)


class FaultInjector:
    """Runs the configured faults against a built deployment and its pipeline."""

    def __init__(self, env, cfg: Faults, dep: Deployment, pipeline, rng: np.random.Generator):
        self.env = env
        self.cfg = cfg
        self.dep = dep
        self.pipeline = pipeline
        self.rng = rng
        self.links = {link.name: link for link in dep.links}
        self._link_factors: dict[str, list[float]] = {name: [] for name in self.links}
        self._link_down_since: dict[str, float | None] = {name: None for name in self.links}
        self.link_down_s: Counter = Counter()
        self.retries = 0                 # re-dispatches, all requests together
        self.retried: set[int] = set()   # requests re-dispatched at least once
        pipeline.faults = self
        for ev in cfg.events:
            if isinstance(ev, LinkFault):
                env.process(self._link_fault(ev))

    # -- links --------------------------------------------------------------------------------
    def _link_fault(self, ev: LinkFault):
        yield self.env.timeout(ev.start_s)
        factor = 0.0 if ev.kind == "link_down" else float(ev.factor or 0.0)
        self._set_link(ev.link, factor, on=True)
        if ev.duration_s is None:
            return
        yield self.env.timeout(ev.duration_s)
        self._set_link(ev.link, factor, on=False)

    def _set_link(self, name: str, factor: float, *, on: bool) -> None:
        factors = self._link_factors[name]
        if on:
            factors.append(factor)
        else:
            factors.remove(factor)
        scale = float(np.prod(factors)) if factors else 1.0
        link = self.links[name]
        link.set_scale(scale)
        now = self.env.now
        since = self._link_down_since[name]
        if scale == 0 and since is None:
            self._link_down_since[name] = now
        elif scale > 0 and since is not None:
            self.link_down_s[name] += now - since
            self._link_down_since[name] = None

    def link_is_down(self, link) -> bool:
        return link.scale == 0

    # -- summary ------------------------------------------------------------------------------
    def summary(self, requests, duration_s: float) -> dict:
        """Availability (share of the run each pool had an instance up, each link was up),
        requests retried, failed by reason."""
        dur = max(duration_s, 1e-12)
        out: dict = {}
        for name, since in self._link_down_since.items():
            down = self.link_down_s[name] + (duration_s - since if since is not None else 0.0)
            out[f"availability_{name}"] = 1.0 - down / dur
        out["requests_retried"] = len(self.retried)
        out["retries"] = self.retries
        failed = requests[requests["status"] == "failed"]["failure"]
        reasons = Counter(f.split(": ")[-1] if f not in REASONS else f for f in failed)
        for reason in REASONS:
            out[f"failed_{reason}"] = int(reasons.pop(reason, 0))
        out["failed_other"] = int(sum(reasons.values()))
        return out


REASONS = (STALLED,)
