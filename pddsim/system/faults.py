"""Faults during a run (`faults:` in the config): links that go down or degrade, instances that
die and restart empty, random failures per role; and what the run keeps about them.

An instance that dies leaves its pool (routers no longer see it), every request whose attempt it
held is re-dispatched from scratch (its KV is lost), then the instance is wiped; it comes back
serving nothing, its cache empty. A request whose first pool has no instance up waits for one.

A link fault scales the link's capacity (0: down): flows on it get rate 0 in the link's sharing
and resume where they stopped when it comes back. Overlapping faults of one link multiply.
Without `faults` in the config nothing here exists, so a run without faults pays nothing.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Callable

import numpy as np

from pddsim.config import Faults, InstanceFault, LinkFault
from pddsim.engine import clock
from pddsim.engine.request import Request
from pddsim.system.deployment import Deployment
from pddsim.system.stages import PREFILL_QUEUE

if TYPE_CHECKING:
    from pddsim.system.scaling import Elastic

STALLED = "stalled"              # could make no more progress (a line or pool that never came back)
INSTANCE_FAILED = "instance_failed"     # its instance died more often than it may be re-dispatched
TRANSFER_TIMEOUT = "transfer_timeout"   # its KV stalled past the timeout more often than that
REASONS = (INSTANCE_FAILED, TRANSFER_TIMEOUT, STALLED)


class FaultInjector:
    """Runs the configured faults against a built deployment and its pipeline, which builds it
    (see `Pipeline`); the faults begin with `start`."""

    def __init__(self, env, cfg: Faults, dep: Deployment, pipeline, rng: np.random.Generator,
                 in_flight: dict[int, Request]):
        self.env = env
        self.in_flight = in_flight       # the run's requests issued and not ended, by index
        self.cfg = cfg
        self.dep = dep
        self.pipeline = pipeline
        self.rng = rng
        self.links = {link.name: link for link in dep.links}
        self._link_factors: dict[str, list[float]] = {name: [] for name in self.links}
        self._link_down_since: dict[str, float | None] = {name: None for name in self.links}
        self.link_down_s: defaultdict[str, float] = defaultdict(float)
        self.retries = 0                 # re-dispatches, all requests together
        self.retried: set[int] = set()   # requests re-dispatched at least once
        self.members = dep.members       # every instance built, in service or not
        self.elastic: Elastic | None = None     # the run's Elastic pools, when a group scales
        self.entry = "colocated" if "colocated" in dep.pools else "prefill"
        self._down: Counter = Counter()            # faults holding each instance down
        self._pool_empty_since: dict[str, float | None] = dict.fromkeys(dep.pools)
        self.pool_empty_s: defaultdict[str, float] = defaultdict(float)
        self.parked: list[tuple[Request, Callable[[], None]]] = []   # waiting for a pool to have an instance

    def start(self) -> None:
        """Start the configured faults' processes."""
        for ev in self.cfg.events:
            if isinstance(ev, LinkFault):
                self.env.process(self._link_fault(ev))
            else:
                self.env.process(self._instance_fault(ev))
        for rf in self.cfg.random:
            for inst in self.members[rf.role]:
                self.env.process(self._random_failures(inst, rf, self.dep.daemons))

    # -- requests -----------------------------------------------------------------------------
    def dispatch(self, req: Request) -> None:
        """Send a request in, or hold it while its first pool has no instance up."""
        if self.dep.pools[self.entry]:
            self.pipeline.dispatch(req)
        else:
            self.park(req, lambda: self.dispatch(req))

    def park(self, req: Request, resume: Callable[[], None]) -> None:
        """Hold the request until an instance restarts, then `resume` it (if it is still this
        attempt of a request in flight)."""
        self.parked.append((req, resume))

    def retry(self, req: Request, reason: str) -> None:
        """The request's attempt is lost (its instance died, its KV stalled too long): let go
        of what it holds and send it again from scratch, or fail it with `reason` once it has
        been re-dispatched `max_retries` times."""
        if req.retries >= self.cfg.max_retries:
            self.pipeline.give_up(req, reason)
            return
        self.pipeline.abandon(req)
        self.retries += 1
        self.retried.add(req.idx)
        again = self.in_flight[req.idx] = req.retried(clock.now(self.env), PREFILL_QUEUE)
        self.dispatch(again)

    # -- instances ----------------------------------------------------------------------------
    def is_down(self, inst) -> bool:
        return self._down[inst] > 0

    def _instance_fault(self, ev: InstanceFault):
        if ev.instance is not None:
            targets = [i for pool in self.members.values() for i in pool if i.name == ev.instance]
        else:
            pool = [i for i in self.members[str(ev.role)] if i.cluster == ev.cluster]
            targets = pool[:ev.count] if ev.count is not None else pool
        yield clock.timeout(self.env, ev.start_s)
        for inst in targets:
            self._take_down(inst)
        if ev.duration_s is None:
            return
        yield clock.timeout(self.env, ev.duration_s)
        for inst in targets:
            self._bring_up(inst)

    def _random_failures(self, inst, rf, daemons):
        """One instance failing at random: exponential up-times (waiting for the next failure is
        no progress: a run stuck otherwise still ends) and repair times."""
        while True:
            yield daemons.sleep(float(self.rng.exponential(rf.mtbf_s)))
            self._take_down(inst)
            # only then is the run judged: the requests it re-dispatched are progress, not stuck
            if not daemons.keep_going():
                return
            yield clock.timeout(self.env, float(self.rng.exponential(rf.mttr_s)))
            self._bring_up(inst)

    def _take_down(self, inst) -> None:
        self._down[inst] += 1
        if self._down[inst] > 1:
            return
        if inst in self.dep.pools[inst.role]:    # (not when off, starting or draining)
            self.leave_pool(inst)
        for req in list(self.in_flight.values()):
            if self.pipeline.lost_with(req, inst):
                self.retry(req, INSTANCE_FAILED)
        self.pipeline.instance_lost(inst)
        inst.crash()
        if self.elastic is not None:
            self.elastic.lost(inst)

    def _bring_up(self, inst) -> None:
        self._down[inst] -= 1
        if self._down[inst]:
            return
        if self.elastic is None or self.elastic.restored(inst):
            inst.restart()
            self.join_pool(inst)

    def leave_pool(self, inst) -> None:
        """`inst` leaves service (it died, or drains)."""
        pool = self.dep.pools[inst.role]
        pool.remove(inst)
        if not pool:
            self._pool_empty_since[inst.role] = clock.now(self.env)

    def join_pool(self, inst) -> None:
        """`inst` is in service (restarted, started or no longer draining): requests waiting for
        its pool go on."""
        pool = self.dep.pools[inst.role]
        if not pool:
            since = self._pool_empty_since[inst.role]
            assert since is not None, "an empty pool recorded when it emptied"
            self.pool_empty_s[inst.role] += clock.now(self.env) - since
            self._pool_empty_since[inst.role] = None
        pool.add(inst)
        parked, self.parked = self.parked, []
        for req, resume in parked:
            if self.in_flight.get(req.idx) is req:
                resume()

    # -- links --------------------------------------------------------------------------------
    def _link_fault(self, ev: LinkFault):
        yield clock.timeout(self.env, ev.start_s)
        factor = 0.0 if ev.kind == "link_down" else float(ev.factor or 0.0)
        self._set_link(ev.link, factor, on=True)
        if ev.duration_s is None:
            return
        yield clock.timeout(self.env, ev.duration_s)
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
        now = clock.now(self.env)
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
        for role, since in self._pool_empty_since.items():
            down = self.pool_empty_s[role] + (duration_s - since if since is not None else 0.0)
            out[f"availability_{role}"] = 1.0 - down / dur
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

