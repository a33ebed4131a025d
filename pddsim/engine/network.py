"""Links carrying KV-cache flows: RDMA inside a cluster, the WAN between clusters.

A link is a processor-sharing server: the n flows in flight each get min(cap, capacity/n) bytes/s,
which is the max-min fair share when every flow has the same per-flow cap (a single TCP flow's
window limit on the WAN). Progress is tracked in "virtual bytes" V(t), the bytes each in-flight flow
has received since the link was built; a flow ends when V reaches its start mark plus its size, so
an arrival, a departure or a capacity change costs one heap operation and one rescheduled event.
Delivery happens one-way latency after the last byte leaves.
"""
from __future__ import annotations

import heapq
from typing import Callable

import numpy as np


class Flow:
    """One transfer in flight; `sent` is exact once it has ended or been cancelled."""

    __slots__ = ("size", "start_mark", "on_delivered", "sent", "done")

    def __init__(self, size: float, start_mark: float, on_delivered: Callable[[], None]):
        self.size = size
        self.start_mark = start_mark
        self.on_delivered = on_delivered
        self.sent = 0.0
        self.done = False


class Link:
    """A shared link with bandwidth (bytes/s), one-way latency (s), optional per-flow cap."""

    def __init__(self, env, name: str, bandwidth_Bps: float, latency_s: float,
                 flow_cap_Bps: float | None = None):
        self.env = env
        self.name = name
        self.bandwidth_Bps = bandwidth_Bps
        self.capacity_Bps = bandwidth_Bps    # what background load leaves for our flows
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
        self._advance()
        flow = Flow(float(nbytes), self._mark, on_delivered)
        self.flows_started += 1
        if nbytes <= 0:
            flow.done = True
            self._deliver(flow)
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

    def set_capacity(self, capacity_Bps: float) -> None:
        self._advance()
        self.capacity_Bps = capacity_Bps
        self._reschedule()

    def expected_transfer_s(self, nbytes: float, *, nominal: bool = True) -> float:
        """The time `nbytes` would take at the share a new flow would get now: at the line rate
        (what a router knows) or, with nominal=False, at what other traffic leaves (an oracle)."""
        share = (self.bandwidth_Bps if nominal else self.capacity_Bps) / (self._active + 1)
        if self.flow_cap_Bps is not None:
            share = min(share, self.flow_cap_Bps)
        return nbytes / share + self.latency_s

    # -- internals --------------------------------------------------------------------------
    def _advance(self) -> None:
        now = self.env.now
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
        rate = self.capacity_Bps / self._active
        if self.flow_cap_Bps is not None and self.flow_cap_Bps < rate:
            rate = self.flow_cap_Bps
        self._rate = rate
        delay = max(heap[0][0] - self._mark, 0.0) / rate if rate > 0 else float("inf")
        if delay != float("inf"):
            gen = self._gen
            self.env.timeout(delay).callbacks.append(lambda _e: self._on_timer(gen))

    def _on_timer(self, gen: int) -> None:
        if gen != self._gen:
            return
        self._advance()
        heap = self._heap
        eps = 1e-9 * max(1.0, self._mark)
        finished = []
        while heap and (heap[0][2].done or heap[0][0] <= self._mark + eps):
            _, _, flow = heapq.heappop(heap)
            if not flow.done:
                flow.done = True
                flow.sent = flow.size
                self.bytes_carried += flow.size
                self._active -= 1
                finished.append(flow)
        self._reschedule()
        for flow in finished:
            self._deliver(flow)

    def _deliver(self, flow: Flow) -> None:
        if self.latency_s > 0:
            self.env.timeout(self.latency_s).callbacks.append(lambda _e: flow.on_delivered())
        else:
            flow.on_delivered()


def background_load(env, link: Link, *, mean: float, std: float, period_s: float,
                    correlation: float, rng: np.random.Generator):
    """Process: every `period_s` the share of the link taken by other traffic moves (AR(1) around
    `mean`, clipped to [0, 0.95]); our flows share what is left. This is what turns a 1-second WAN
    transfer into a 20-second one."""
    load = mean
    innovation = std * np.sqrt(1.0 - correlation ** 2)
    while True:
        link.set_capacity(link.bandwidth_Bps * (1.0 - load))
        yield env.timeout(period_s)
        load = float(np.clip(mean + correlation * (load - mean) + rng.normal(0.0, innovation), 0.0, 0.95))
