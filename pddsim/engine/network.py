"""What carries KV-cache flows: a fabric of NICs inside a cluster (RDMA), a link between clusters
(the WAN).

A link is a processor-sharing server: the n flows in flight each get min(cap, capacity/n) bytes/s,
which is the max-min fair share when every flow has the same per-flow cap (a single TCP flow's
window limit on the WAN). Progress is tracked in "virtual bytes" V(t), the bytes each in-flight flow
has received since the link was built; a flow ends when V reaches its start mark plus its size, so
an arrival, a departure or a capacity change costs one heap operation and one rescheduled event.
Delivery happens one-way latency after the last byte leaves. A fabric is a set of such capacities
(each endpoint's NICs, the core) with flows crossing several of them: see `Fabric`.
"""
from __future__ import annotations

import heapq
from math import inf, nextafter
from typing import Callable, Protocol

import numpy as np

from pddsim.engine import clock
from pddsim.engine.daemons import Daemons


class Flow:
    """One transfer in flight; `sent` is exact once it has ended or been cancelled."""

    __slots__ = ("size", "start_mark", "on_delivered", "sent", "done")

    def __init__(self, size: float, start_mark: float, on_delivered: Callable[[], None]):
        self.size = size
        self.start_mark = start_mark
        self.on_delivered = on_delivered
        self.sent = 0.0
        self.done = False


class FlowObserver(Protocol):
    """Told of every flow a link or fabric starts (engine/invariants.py checks what they carried).
    Given at construction; without one a `send` pays one None check."""

    def flow_started(self, link: Link | Fabric, flow: Flow) -> None: ...


class Link:
    """A shared link with bandwidth (bytes/s), one-way latency (s), optional per-flow cap."""

    def __init__(self, env, name: str, bandwidth_Bps: float, latency_s: float,
                 flow_cap_Bps: float | None = None, observer: FlowObserver | None = None):
        self.env = env
        self.name = name
        self.observer = observer
        self.bandwidth_Bps = bandwidth_Bps
        self._capacity = bandwidth_Bps       # what background load and faults leave for our flows
        self.background: Background | None = None   # other traffic, when there is any
        self.scale = 1.0                     # the share of the line in service (faults)
        self._left_Bps = bandwidth_Bps       # what background load leaves
        self.latency_s = latency_s
        self.flow_cap_Bps = flow_cap_Bps
        self.bytes_carried = 0.0
        self.flows_started = 0
        self.busy_s = 0.0                    # time with at least one flow in flight
        self._heap: list[tuple[float, int, Flow]] = []
        self._active = 0
        self._mark = 0.0                     # V(t) at _last_s
        self._last_s = 0.0
        self._rate = 0.0                     # bytes/s each in-flight flow gets now
        self._gen = 0                        # invalidates a scheduled completion
        self._seq = 0

    # -- public -----------------------------------------------------------------------------
    def send(self, nbytes: float, on_delivered: Callable[[], None]) -> Flow:
        """Start a flow of `nbytes`; `on_delivered` runs when its last byte arrives."""
        if nbytes > 0 and self.background is not None:
            self.background.resume()
        self._advance()
        flow = Flow(float(nbytes), self._mark, on_delivered)
        self.flows_started += 1
        if self.observer is not None:
            self.observer.flow_started(self, flow)
        if nbytes <= 0:
            flow.done = True
            deliver_later(self.env, self.latency_s, flow)
            return flow
        self._seq += 1
        heapq.heappush(self._heap, (self._mark + flow.size, self._seq, flow))
        self._active += 1
        self._reschedule()
        return flow

    def cancel(self, flow: Flow) -> None:
        """Stop a flow; the bytes already sent stay counted, the rest of the bandwidth is freed."""
        if flow.done:
            return
        self._advance()
        flow.done = True
        flow.sent = self._mark - flow.start_mark
        self.bytes_carried += flow.sent
        self._active -= 1                    # its heap entry is skipped when it surfaces
        self._reschedule()

    @property
    def flows_in_flight(self) -> int:
        return self._active

    @property
    def capacity_Bps(self) -> float:
        """What background load and faults leave for our flows now (a background tick due at this
        very instant counted only once something acts on the line: see `Background`)."""
        if self.background is not None:
            self.background.catch_up(-inf)
        return self._capacity

    def set_capacity(self, capacity_Bps: float) -> None:
        """What other traffic leaves of the line (background load)."""
        if capacity_Bps == self._left_Bps:   # no rate moves: no rounding may either
            return
        self._advance()
        self._left_Bps = capacity_Bps
        self._capacity = capacity_Bps * self.scale
        self._reschedule()

    def set_scale(self, scale: float) -> None:
        """Run the line at `scale` of its capacity (a degraded line; 0: down, its flows stall)."""
        if scale == self.scale:              # no rate moves (a factor-1 degradation): no rounding may
            return
        if self.background is not None:
            self.background.catch_up(inf)
        self._advance()
        self.scale = scale
        self._capacity = self._left_Bps * scale
        self._reschedule()

    def expected_transfer_s(self, nbytes, *, nominal: bool = True):
        """The time `nbytes` (a number, or an array of them) would take at the share a new flow
        would get now: at the line rate (what a router knows) or, with nominal=False, at what
        other traffic leaves (an oracle)."""
        if not nominal and self.background is not None:
            self.background.catch_up(inf)
        share = (self.bandwidth_Bps if nominal else self._capacity) / (self._active + 1)
        if self.flow_cap_Bps is not None:
            share = min(share, self.flow_cap_Bps)
        if share <= 0:                       # the line is down (an oracle knows)
            return inf
        return nbytes / share + self.latency_s

    # -- internals --------------------------------------------------------------------------
    def _advance(self) -> None:
        now = clock.now(self.env)
        if self._active:
            self._mark += self._rate * (now - self._last_s)
            self.busy_s += now - self._last_s
        self._last_s = now

    def _reschedule(self) -> None:
        heap = self._heap
        while heap and heap[0][2].done:
            heapq.heappop(heap)
        self._gen += 1
        if not self._active:
            self._rate = 0.0
            return
        rate = self._capacity / self._active
        if self.flow_cap_Bps is not None and self.flow_cap_Bps < rate:
            rate = self.flow_cap_Bps
        self._rate = rate
        delay = max(heap[0][0] - self._mark, 0.0) / rate if rate > 0 else inf
        if delay != inf:
            clock.timeout(self.env, delay, self._gen, self._on_timer)

    def _on_timer(self, timer) -> None:
        if clock.value(timer) != self._gen:         # a later change rescheduled the next end
            return
        self._advance()
        heap = self._heap
        now, mark, rate = clock.now(self.env), self._mark, self._rate
        finished: list[Flow] = []
        # The timer was set for the first end: that flow has ended, whatever rounding left of its
        # bytes; so have those whose rest the clock cannot resolve (rate > 0, or no timer is set).
        while heap and (heap[0][2].done or not finished
                        or ends_now(now, (heap[0][0] - mark) / rate)):
            _, _, flow = heapq.heappop(heap)
            if not flow.done:
                flow.done = True
                flow.sent = flow.size
                self.bytes_carried += flow.size
                self._active -= 1
                finished.append(flow)
        self._reschedule()
        for flow in finished:
            deliver(self.env, self.latency_s, flow)



class FabricFlow(Flow):
    """A flow across a fabric: the ports it crosses, the rate it gets now, its rank among the
    fabric's flows (the order rates are allocated in)."""

    __slots__ = ("path", "rate", "seq")

    def __init__(self, size: float, path: tuple, on_delivered: Callable[[], None], seq: int):
        super().__init__(size, 0.0, on_delivered)
        self.path = path
        self.rate = 0.0
        self.seq = seq


class Port:
    """One capacity flows cross: an endpoint's sending or receiving NICs, or the fabric's core."""

    __slots__ = ("name", "capacity_Bps", "left", "unfixed", "flows")

    def __init__(self, name: str, capacity_Bps: float):
        self.name = name
        self.capacity_Bps = capacity_Bps
        self.left = 0.0                      # scratch of the rate allocation
        self.unfixed = 0
        self.flows: dict[FabricFlow, None] = {}   # the flows crossing it now


class Fabric:
    """A cluster's RDMA network: each endpoint (instance) sends through its own NICs and receives
    through them, and every flow between two endpoints also crosses the core when the fabric is
    oversubscribed (a non-blocking fabric has none). A flow gets the max-min fair rate over the
    ports it crosses, found by progressive filling: raise every unfixed flow's rate together until
    a port is full, fix the flows crossing it at that rate, repeat. Rates are recomputed when a
    flow starts or ends, or a capacity changes: one event per change, not per packet. So a bigger
    cluster at the same load per endpoint is no slower, and a receiver fed by many senders is the
    bottleneck it is in a real network (incast).

    Flows that share no port, even through other flows, do not affect each other's rates, and the
    filling gives each such group the rates it would give it alone (bit for bit: its ports and
    flows are taken in the same order). So a start or an end re-allocates only the group of the
    ports it touches: without a core, a few flows however large the cluster."""

    def __init__(self, env, name: str, latency_s: float, core_Bps: float | None = None,
                 observer: FlowObserver | None = None):
        self.env = env
        self.name = name
        self.observer = observer
        self.latency_s = latency_s
        self.core = None if core_Bps is None else Port(f"{name}/core", core_Bps)
        self.scale = 1.0                     # the share of every capacity in service (faults)
        self.bytes_carried = 0.0
        self.flows_started = 0
        self.busy_s = 0.0
        self._tx: dict[object, Port] = {}
        self._rx: dict[object, Port] = {}
        self._flows: list[FabricFlow] = []  # in the order they started
        self._seq = 0
        self._last_s = 0.0
        self._gen = 0
        self._due: FabricFlow | None = None  # the flow the next end is scheduled for

    def attach(self, endpoint, nic_Bps: float) -> None:
        """Give `endpoint` NICs of `nic_Bps` in each direction."""
        name = getattr(endpoint, "name", str(endpoint))
        self._tx[endpoint] = Port(f"{name}/tx", nic_Bps)
        self._rx[endpoint] = Port(f"{name}/rx", nic_Bps)

    # -- public -----------------------------------------------------------------------------
    @property
    def capacity_Bps(self) -> float:
        """The most the fabric carries at once: every sender at its NICs' rate, or the core's."""
        total = sum(p.capacity_Bps for p in self._tx.values())
        return self.scale * (total if self.core is None else min(total, self.core.capacity_Bps))

    @property
    def flows_in_flight(self) -> int:
        return len(self._flows)

    def send(self, src, dst, nbytes: float, on_delivered: Callable[[], None]) -> FabricFlow:
        """Start a flow of `nbytes` from endpoint `src` to `dst`."""
        self._advance()
        path = (self._tx[src], self._rx[dst]) if self.core is None \
            else (self._tx[src], self.core, self._rx[dst])
        self._seq += 1
        flow = FabricFlow(float(nbytes), path, on_delivered, self._seq)
        self.flows_started += 1
        if self.observer is not None:
            self.observer.flow_started(self, flow)
        if nbytes <= 0:
            flow.done = True
            deliver_later(self.env, self.latency_s, flow)
            return flow
        self._flows.append(flow)
        for p in path:
            p.flows[flow] = None
        self._reschedule(path)
        return flow

    def cancel(self, flow: FabricFlow) -> None:
        """Stop a flow; the bytes already sent stay counted, its share is freed."""
        if flow.done:
            return
        self._advance()
        flow.done = True
        self.bytes_carried += flow.sent
        self._flows.remove(flow)
        self._leave(flow)
        self._reschedule(flow.path)

    def set_scale(self, scale: float) -> None:
        """Run every port at `scale` of its capacity (a degraded or failed fabric)."""
        if scale == self.scale:              # no rate moves (a factor-1 degradation): no rounding may
            return
        self._advance()
        self.scale = scale
        self._reschedule()

    def expected_transfer_s(self, src, dst, nbytes):
        """The time `nbytes` takes from `src` to `dst` on an idle fabric."""
        rate = min(self._tx[src].capacity_Bps, self._rx[dst].capacity_Bps,
                   inf if self.core is None else self.core.capacity_Bps)
        return nbytes / rate + self.latency_s

    def port_loads(self) -> list[tuple[str, float, float]]:
        """(port, rate of the flows crossing it, capacity in service) for every port in use."""
        loads: dict[int, list] = {}
        for f in self._flows:
            for p in f.path:
                loads.setdefault(id(p), [p.name, 0.0, self.scale * p.capacity_Bps])[1] += f.rate
        return [tuple(v) for v in loads.values()]

    # -- internals --------------------------------------------------------------------------
    def _advance(self) -> None:
        now = clock.now(self.env)
        dt = now - self._last_s
        if self._flows and dt > 0:
            for f in self._flows:
                f.sent += f.rate * dt
            self.busy_s += dt
        self._last_s = now

    def _leave(self, flow: FabricFlow) -> None:
        for p in flow.path:
            del p.flows[flow]

    def _group(self, ports) -> list[FabricFlow]:
        """The flows joined to `ports` through shared ports, in the fabric's order."""
        seen, todo = set(ports), list(ports)
        flows: dict[FabricFlow, None] = {}
        while todo:
            for f in todo.pop().flows:
                if f not in flows:
                    flows[f] = None
                    for p in f.path:
                        if p not in seen:
                            seen.add(p)
                            todo.append(p)
        return sorted(flows, key=_seq)

    def _allocate(self, flows: list[FabricFlow]) -> None:
        """Max-min fair rates of `flows` (all the flows crossing their ports) by progressive
        filling."""
        if not flows:
            return
        if len(flows) == 1:
            rate = inf
            for p in flows[0].path:
                if p.capacity_Bps < rate:
                    rate = p.capacity_Bps
            flows[0].rate = self.scale * rate
            return
        ports = {}
        for f in flows:
            for p in f.path:
                if id(p) not in ports:
                    ports[id(p)] = p
                    p.left = self.scale * p.capacity_Bps
                    p.unfixed = 0
                p.unfixed += 1
        unfixed = flows
        while unfixed:
            neck, least = None, 0.0           # the port that fills first (the first of equals)
            for p in ports.values():
                if p.unfixed and (neck is None or p.left / p.unfixed < least):
                    neck, least = p, p.left / p.unfixed
            assert neck is not None
            share = max(neck.left, 0.0) / neck.unfixed
            rest = []
            for f in unfixed:
                if neck in f.path:
                    f.rate = share
                    for p in f.path:
                        p.left -= share
                        p.unfixed -= 1
                else:
                    rest.append(f)
            unfixed = rest

    def _reschedule(self, touched=None) -> None:
        """Re-allocate the rates of the group of the `touched` ports (of every flow when None, or
        when there are too few flows for the group to be worth finding), and schedule the next end."""
        self._gen += 1
        if not self._flows:
            return
        flows = self._flows
        self._allocate(flows if touched is None or self.core is not None or len(flows) <= 4
                       else self._group(touched))
        delay, self._due = inf, None
        for f in self._flows:
            if f.rate > 0 and (f.size - f.sent) / f.rate < delay:
                delay, self._due = (f.size - f.sent) / f.rate, f
        if delay != inf:
            clock.timeout(self.env, max(delay, 0.0), self._gen, self._on_timer)

    def _on_timer(self, timer) -> None:
        if clock.value(timer) != self._gen:         # a later change rescheduled the next end
            return
        self._advance()
        finished, active = [], []
        now, due = clock.now(self.env), self._due
        for f in self._flows:
            # the flow the timer was set for has ended, whatever rounding left of its bytes; so
            # have those whose rest the clock cannot resolve
            if f is due or (f.rate > 0 and ends_now(now, (f.size - f.sent) / f.rate)):
                f.done = True
                f.sent = f.size
                self.bytes_carried += f.size
                finished.append(f)
                self._leave(f)
            else:
                active.append(f)
        self._flows = active
        self._reschedule({p: None for f in finished for p in f.path} if active else None)
        for f in finished:
            deliver(self.env, self.latency_s, f)


def _seq(flow: FabricFlow) -> int:
    return flow.seq


def ends_now(now: float, remaining_s: float) -> bool:
    """Whether a flow with `remaining_s` of sending left ends at `now`: when the clock cannot tell
    now from now + remaining_s, waiting for the rest would not advance time (a livelock)."""
    return now + remaining_s <= now


def deliver(env, latency_s: float, flow: Flow) -> None:
    """The flow's last byte left now: it arrives one-way latency later."""
    if latency_s > 0:
        clock.timeout(env, latency_s, flow, _arrived)
    else:
        flow.on_delivered()


def deliver_later(env, latency_s: float, flow: Flow) -> None:
    """A flow with nothing to send, started now: it arrives one-way latency later, from an event of
    its own even on a line without latency (never inside the `send` that started it)."""
    clock.timeout(env, latency_s, flow, _arrived)


def _arrived(delivery) -> None:
    """A delivery's timeout (its value the flow) fired: the flow's bytes have all arrived."""
    clock.value(delivery).on_delivered()


SHOCKS_PER_DRAW = 256


def normal_draws(rng: np.random.Generator, scale: float, per_draw: int = SHOCKS_PER_DRAW):
    """Normal(0, scale) values one at a time, drawn `per_draw` at a call: numpy's Generator gives the
    values (and order) one call per value gives, at a fraction of the calls. It draws ahead, so
    `rng` must be the caller's own."""
    while True:
        yield from rng.normal(0.0, scale, per_draw).tolist()


class Background:
    """Other traffic's share of a link: every `period_s` it moves (AR(1) around `mean`, clipped to
    [0, 0.95]) and our flows share what is left. This is what turns a 1-second WAN transfer into a
    20-second one. `rng` is its own. A daemon (`engine/daemons.py`): it stops once only daemons
    are left.

    It ticks as SimPy events only while the link carries flows, or while a run's stuck handler is
    installed (with faults, a stuck run is found at a daemon's tick, this one's included). On an
    idle link no tick is scheduled: the ticks missed are applied when something looks (a flow
    starts, the capacity is read, a fault scales the line), one draw each in the same order, so
    every capacity is the one a tick per period gives, bit for bit.

    Same-instant order: a tick due at the instant of a look came first if it was scheduled (at
    the tick before it, `since`) no later than the looking event was (`looked_from`; a flow or a
    router looks from an event scheduled within the last period, the sampler from its own last
    tick). A tick scheduled again after the link was idle (`resume`) gets its event id then, later
    than a tick per period would have, and so may every tick after it: from then on, a look at a
    tick's instant that came after the tick applies it (`early`), and the tick event only
    schedules the next."""

    __slots__ = ("env", "link", "mean", "correlation", "period_s", "daemons", "load", "since",
                 "due", "ticking", "exact", "early", "stopped", "_shocks")

    def __init__(self, env, link: Link, *, mean: float, std: float, period_s: float,
                 correlation: float, rng: np.random.Generator, daemons: Daemons):
        self.env = env
        self.link = link
        self.mean = mean
        self.correlation = correlation
        self.period_s = period_s
        self.daemons = daemons
        self.load = mean
        self.since = 0.0                     # when the tick before `due` was (or would have been)
        self.due = 0.0                       # when the next tick is
        self.ticking = False                 # the next tick is scheduled as an event
        self.exact = True                    # ticks are in the order a tick per period gives
        self.early = False                   # ... and a look has applied it already
        self.stopped = False                 # a daemon's end: only daemons were left
        self._shocks = normal_draws(rng, std * np.sqrt(1.0 - correlation ** 2))
        link.background = self
        clock.urgent(env, self._start)       # at time 0, urgent: as a process would start

    def _start(self, _event: clock.Timer) -> None:
        self._set()
        self.due = self.period_s
        self._sleep(self.period_s)

    def _set(self) -> None:
        link = self.link
        link.set_capacity(link.bandwidth_Bps * (1.0 - self.load))

    def _step(self) -> None:
        """One period's move of the load."""
        mean = self.mean
        self.load = min(max(mean + self.correlation * (self.load - mean) + next(self._shocks), 0.0),
                        0.95)

    def _sleep(self, delay: float) -> None:
        self.ticking = True
        self.daemons.sleep(delay, then=self._tick)

    def _tick(self, _event: clock.Timer) -> None:
        self.ticking = False
        if not self.daemons.keep_going():
            self.stopped = True
            return
        if self.early:                       # a look at this instant applied it
            self.early = False
        else:
            self._step()
            self._set()
        now = clock.now(self.env)
        self.since, self.due = now, now + self.period_s
        if self.link._active or self.daemons.stuck is not None:
            self._sleep(self.period_s)
        # else idle: the next ticks wait for a look

    def catch_up(self, looked_from: float) -> None:
        """Apply the ticks due before now, and the one due now if it came before the look (see
        the class; -inf leaves a tie to the next look)."""
        if self.stopped:
            return
        now, since, due = clock.now(self.env), self.since, self.due
        if self.ticking:
            if due == now and since <= looked_from and not self.exact and not self.early:
                self._step()
                self._set()
                self.early = True
            return
        if due > now or (due == now and since > looked_from):
            return
        period = self.period_s
        while due < now or (due == now and since <= looked_from):
            self._step()
            since, due = due, due + period
        self.since, self.due = since, due
        self._set()

    def resume(self) -> None:
        """A flow starts on the link: tick as events again (from the next tick due) if idle."""
        self.catch_up(inf)
        if self.ticking or self.stopped:
            return
        now, due = clock.now(self.env), self.due
        delay = due - now                    # a delay SimPy adds up to exactly `due`
        while now + delay < due:
            delay = nextafter(delay, inf)
        while now + delay > due:
            delay = nextafter(delay, -inf)
        self._sleep(delay)
        self.exact = False
