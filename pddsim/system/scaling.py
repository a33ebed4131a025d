"""Elastic pools: how many instances of each group are held over a run, under the policy its
`scaling:` names (see docs/elastic.md).

An instance is off (not held: it costs nothing), starting (held, not yet useful: its weights
load), serving (in its pool) or draining (out of its pool, finishing what it holds; its prefix
cache is lost when it stops). A group's controller sets how many it wants; the group then starts
or retires instances to match: a drain is taken back before anything starts, a start-up is
cancelled before anything drains. Faults (`system/faults.py`) take instances down and bring them
back through the same pools; a starting instance that dies starts over once repaired, a draining
one that dies is let go.

The run keeps each instance's held intervals (its cost: GPU-seconds held), the scale events, and
when each group served with fewer instances than it wanted (short). A run whose groups are all
`fixed` builds none of this.
"""
from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

import numpy as np

from pddsim.config import Config
from pddsim.engine import clock
from pddsim.engine.instance import Instance
from pddsim.engine.request import Request
from pddsim.system.deployment import Deployment, Group

OFF, STARTING, SERVING, DRAINING = "off", "starting", "serving", "draining"


@dataclass
class GroupState:
    """One group's controller state and record."""
    group: Group
    wanted: int
    last_change: float = -math.inf
    ups: int = 0                         # instances asked for (started, or taken back from a drain)
    downs: int = 0                       # instances retired
    short_since: float | None = None
    short: list[tuple[float, float]] = field(default_factory=list)   # (from, to): fewer serving than wanted
    seen: int = 0                        # ended requests read by its reactive controller so far


class Elastic:
    """The held instances of a deployment whose groups scale, and what they cost."""

    def __init__(self, env, cfg: Config, dep: Deployment, pipeline, in_flight: dict[int, Request],
                 faults=None):
        self.env = env
        self.dep = dep
        self.pipeline = pipeline
        self.in_flight = in_flight
        self.faults = faults
        if faults is not None:
            faults.elastic = self
        self.gpu_type = {c: cl.gpu for c, cl in cfg.clusters.items()}
        self.state: dict[Instance, str] = {}
        self.held: dict[Instance, list[list[float]]] = {}   # [from, to] intervals, to = inf while held
        self._start_gen: dict[Instance, int] = {}           # invalidates a start-up timer
        self.groups: list[GroupState] = []
        self.group_of: dict[Instance, GroupState] = {}
        # completed requests' end time, TTFT and TPOT, for reactive latency targets
        self.ended_at, self.ttft, self.tpot = array("d"), array("d"), array("d")
        self.watch_latency = False
        for g in dep.groups:
            gs = GroupState(g, g.spec.count)
            self.groups.append(gs)
            for k, inst in enumerate(g.instances):
                self.group_of[inst] = gs
                self.held[inst] = [[0.0, math.inf]] if k < g.spec.count else []
                self.state[inst] = SERVING if k < g.spec.count else OFF
                self._start_gen[inst] = 0
            sc = g.spec.scaling
            if sc.policy == "schedule":
                env.process(self._follow_schedule(gs))
            elif sc.policy == "reactive":
                self.watch_latency |= sc.ttft_s is not None or sc.tpot_s is not None
                env.process(self._react(gs))

    @staticmethod
    def needed(cfg: Config) -> bool:
        """Does any group of `cfg` scale?"""
        return any(g.scaling.policy != "fixed" for c in cfg.clusters.values() for g in c.instances)

    # -- policies -------------------------------------------------------------------------------
    def _follow_schedule(self, gs: GroupState):
        """Set the wanted count at each hour the schedule names, day after day (from the run's
        start, midnight). The k-th change is at its own time, not found again from the clock: a
        boundary the clock meets by rounding (4 h of a 10 s day) is passed once, not re-slept."""
        sc = gs.group.spec.scaling
        day = sc.day_s
        at = sorted((h / 24 * day, n) for h, n in sc.schedule.items())   # (second of the day, count)
        daemons = self.dep.daemons
        assert daemons is not None
        self.set_wanted(gs, at[0][1] if at[0][0] == 0 else at[-1][1])   # at midnight
        k = 1 if at[0][0] == 0 else 0
        while True:
            days, i = divmod(k, len(at))
            yield daemons.sleep(max(days * day + at[i][0] - clock.now(self.env), 0.0))
            if not daemons.keep_going():    # asked before acting: a start-up is progress, so a
                return                      # stuck run must be seen as stuck before one starts
            self.set_wanted(gs, at[i][1])
            k += 1

    def _react(self, gs: GroupState):
        """Every `interval_s`: the ratio of each observed figure to its target (the largest
        decides, as a horizontal pod autoscaler does), the wanted count the held count times it,
        rounded up; no change within `tolerance` of 1, nor sooner than `cooldown_s` after the last."""
        sc = gs.group.spec.scaling
        daemons = self.dep.daemons
        assert daemons is not None
        while True:
            yield daemons.sleep(sc.interval_s)
            if not daemons.keep_going():    # (before acting, as a schedule does)
                return
            ratio = self.observed_ratio(gs)
            now = clock.now(self.env)
            if ratio is not None and abs(ratio - 1) > sc.tolerance and \
                    now - gs.last_change >= sc.cooldown_s:
                held = sum(self.state[i] in (STARTING, SERVING) for i in gs.group.instances)
                want = min(max(math.ceil(held * ratio), sc.min), gs.group.spec.most)
                if want != gs.wanted:
                    gs.last_change = now
                    self.set_wanted(gs, want)

    def observed_ratio(self, gs: GroupState) -> float | None:
        """The largest observed / target ratio of the group's reactive targets now (None: no
        target has a figure: nothing serving, no request ended in the last interval)."""
        sc = gs.group.spec.scaling
        serving = self.dep.pools[gs.group.spec.role]
        mine = [i for i in serving if self.group_of.get(i) is gs]
        ratios = []
        if mine and sc.queue_per_instance is not None:
            ratios.append(sum(len(i.waiting) for i in mine) / len(mine) / sc.queue_per_instance)
        if mine and sc.kv_occupancy is not None:
            ratios.append(sum(i.kv_in_use / i.capacity for i in mine) / len(mine) / sc.kv_occupancy)
        recent = slice(gs.seen, len(self.ended_at))
        gs.seen = len(self.ended_at)
        for target, values in ((sc.ttft_s, self.ttft), (sc.tpot_s, self.tpot)):
            if target is not None:
                got = np.asarray(values[recent])
                got = got[~np.isnan(got)]
                if len(got):
                    ratios.append(float(np.percentile(got, sc.percentile)) / target)
        return max(ratios) if ratios else None

    def request_ended(self, req: Request) -> None:
        """What a controller reads of ended requests: their TTFT and TPOT."""
        if not self.watch_latency or req.failed is not None or req.first_token_s is None:
            return
        self.ended_at.append(clock.now(self.env))
        self.ttft.append(req.first_token_s - req.arrival_s)
        self.tpot.append((req.last_token_s - req.first_token_s) / (req.tokens_out - 1)
                         if req.tokens_out > 1 else math.nan)

    # -- matching the wanted count ------------------------------------------------------------------
    def set_wanted(self, gs: GroupState, n: int) -> None:
        gs.wanted = n
        insts = gs.group.instances
        held = [i for i in insts if self.state[i] in (STARTING, SERVING)]
        if len(held) < n:
            back = [i for i in insts if self.state[i] == DRAINING][:n - len(held)]
            for inst in back:                         # warm, and still held: no start-up
                self.state[inst] = SERVING
                self._join(inst)
            spare = [i for i in insts if self.state[i] == OFF and not self._is_down(i)]
            for inst in spare[:n - len(held) - len(back)]:
                self._start(inst)
            gs.ups += len(back) + min(len(spare), n - len(held) - len(back))
        elif len(held) > n:
            for inst in self._retire_order(held)[:len(held) - n]:
                self._retire(inst)
                gs.downs += 1
        self._update_short(gs)

    def _retire_order(self, held: list[Instance]) -> list[Instance]:
        """Which go first: those starting (newest first), then those down, then the serving ones
        holding the least work (they drain soonest; the newest first on a tie)."""
        def key(k_inst):
            k, inst = k_inst
            if self.state[inst] == STARTING:
                return (0, 0, -k)
            if self._is_down(inst):
                return (1, 0, -k)
            return (2, inst.kv_in_use + inst.queued_tokens + len(inst.waiting), -k)
        return [inst for _, inst in sorted(enumerate(held), key=key)]

    def _start(self, inst: Instance) -> None:
        self.state[inst] = STARTING
        self.held[inst].append([clock.now(self.env), math.inf])
        self._start_timer(inst)

    def _start_timer(self, inst: Instance) -> None:
        self._start_gen[inst] += 1
        gen = self._start_gen[inst]
        clock.timeout(self.env, self.group_of[inst].group.startup_s,
                      then=lambda _e: self._started(inst, gen))

    def _started(self, inst: Instance, gen: int) -> None:
        if self._start_gen[inst] != gen or self.state[inst] != STARTING:
            return                                    # cancelled, or it died while starting
        self.state[inst] = SERVING
        inst.restart()
        self._join(inst)
        self._update_short(self.group_of[inst])

    def _retire(self, inst: Instance) -> None:
        state = self.state[inst]
        if state == STARTING or self._is_down(inst):
            self._start_gen[inst] += 1
            self._release(inst)
            return
        assert state == SERVING
        self.state[inst] = DRAINING
        self._leave(inst)
        self.env.process(self._drain(inst))

    def _drain(self, inst: Instance):
        """Wait until the draining instance holds no work, checking as a controller polling the
        engine would, every `drain_poll_s`; then it stops, its cache lost."""
        poll = self.group_of[inst].group.spec.scaling.drain_poll_s
        daemons = self.dep.daemons
        assert daemons is not None
        while self.state[inst] == DRAINING:
            if self._idle(inst):
                inst.crash()
                self._release(inst)
                return
            yield daemons.sleep(poll)
            if not daemons.keep_going():
                return

    def _idle(self, inst: Instance) -> bool:
        """Nothing on the instance, no request in flight that will still send it work (its
        prompt's KV on the way, a handoff to come), and no ended request's work left anywhere (a
        catch-up's token IDs on their way to an MD)."""
        if inst.kv_in_use or inst.waiting or inst.prefilling or inst.inbound_tokens or \
                self.pipeline.leftovers:
            return False
        return not any(self.pipeline.refers(req, inst) for req in self.in_flight.values())

    def _release(self, inst: Instance) -> None:
        self.state[inst] = OFF
        self.held[inst][-1][1] = clock.now(self.env)
        self._update_short(self.group_of[inst])

    def is_held(self, inst: Instance) -> bool:
        return self.state[inst] != OFF

    # -- pools, shared with faults --------------------------------------------------------------------
    def _is_down(self, inst: Instance) -> bool:
        return self.faults is not None and self.faults.is_down(inst)

    def _join(self, inst: Instance) -> None:
        if self.faults is not None:
            self.faults.join_pool(inst)
        else:
            self.dep.pools[inst.role].add(inst)

    def _leave(self, inst: Instance) -> None:
        if self.faults is not None:
            self.faults.leave_pool(inst)
        else:
            self.dep.pools[inst.role].remove(inst)

    def lost(self, inst: Instance) -> None:
        """A fault took `inst` down (it has crashed): a start-up under way is lost, a drain is
        over (nothing is left to finish)."""
        state = self.state[inst]
        if state == STARTING:
            self._start_gen[inst] += 1
        elif state == DRAINING:
            self._release(inst)
        self._update_short(self.group_of[inst])

    def restored(self, inst: Instance) -> bool:
        """`inst` is repaired: True if it goes back into service now; one that was starting
        starts over, one let go meanwhile stays off."""
        state = self.state[inst]
        if state == STARTING:
            self._start_timer(inst)
        return state == SERVING

    # -- the record -------------------------------------------------------------------------------------
    def _update_short(self, gs: GroupState) -> None:
        serving = sum(self.state[i] == SERVING and not self._is_down(i) for i in gs.group.instances)
        now = clock.now(self.env)
        if serving < gs.wanted and gs.short_since is None:
            gs.short_since = now
        elif serving >= gs.wanted and gs.short_since is not None:
            if now > gs.short_since:
                gs.short.append((gs.short_since, now))
            gs.short_since = None

    def held_s(self, inst: Instance, t0: float, t1: float) -> float:
        """Seconds `inst` was held within [t0, t1]."""
        return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in self.held[inst])

    def mean_gpus(self, t0: float, t1: float) -> dict[str, float]:
        """GPUs held on average over [t0, t1], per GPU type (an instance held throughout adds
        exactly its GPUs: a run that never scales costs what its fixed pools cost)."""
        span = t1 - t0
        out: dict[str, float] = {}
        for gs in self.groups:
            g = gs.group
            gpu = self.gpu_type[g.cluster]
            for inst in g.instances:
                out[gpu] = out.get(gpu, 0.0) + g.spec.gpus * (self.held_s(inst, t0, t1) / span
                                                              if span > 0 else 0.0)
        return out

    def summary(self, arrival_s: np.ndarray, finish_s: np.ndarray, t0: float, t1: float) -> dict:
        """GPU-hours held per role over [t0, t1], scale events per role, and the share of the
        requests (`arrival_s`, `finish_s`) in the system while some group was short."""
        out: dict = {}
        intervals = []
        for gs in self.groups:
            role, g = gs.group.spec.role, gs.group
            hours = sum(self.held_s(i, t0, t1) for i in g.instances) * g.spec.gpus / 3600
            out[f"gpu_hours_{role}"] = out.get(f"gpu_hours_{role}", 0.0) + hours
            out[f"scale_ups_{role}"] = out.get(f"scale_ups_{role}", 0) + gs.ups
            out[f"scale_downs_{role}"] = out.get(f"scale_downs_{role}", 0) + gs.downs
            intervals += gs.short + ([(gs.short_since, t1)] if gs.short_since is not None else [])
        out["short_s"] = _union_s(intervals)
        out["requests_while_short_share"] = _overlap_share(intervals, arrival_s, finish_s)
        return out


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _union_s(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in _merged(intervals))


def _overlap_share(intervals, arrival_s: np.ndarray, finish_s: np.ndarray) -> float:
    """Share of the requests whose [arrival, finish] meets one of `intervals`."""
    if len(arrival_s) == 0:
        return 0.0
    merged = _merged(intervals)
    if not merged:
        return 0.0
    starts = np.array([a for a, _ in merged])
    ends = np.array([b for _, b in merged])
    k = np.searchsorted(ends, arrival_s, side="left")   # the first interval not over by then
    hit = k < len(merged)
    hit[hit] = starts[k[hit]] <= finish_s[hit]
    return float(hit.mean())
