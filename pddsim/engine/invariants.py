"""Opt-in checks of the rules every run must keep (`simulate(..., check_invariants=True)`,
`pddsim run --check-invariants`). A broken rule raises `InvariantError` at the event that broke it.

Off, none of this runs: the plain SimPy environment is used and the links have no observer, so a
normal run pays nothing. On, every event is followed by a scan of every instance and link, which
makes a run several times slower: it is meant for tests and for a scenario that looks wrong.
Nothing here patches a live object: the links are built with a `FlowLog` as their observer.
Never compiled (pddsim.build.COMPILED leaves it out): `CheckedEnvironment` subclasses SimPy's.
"""
from __future__ import annotations

from typing import Callable

import simpy

from pddsim.engine.network import Fabric, Flow, Link
from pddsim.errors import InvariantError

REL = 1e-9     # float slack for byte and rate sums


class CheckedEnvironment(simpy.Environment):
    """A SimPy environment that runs `checks` after every event and refuses a clock that goes back."""

    def __init__(self):
        super().__init__()
        self.checks: list = []

    def step(self) -> None:
        before = self.now
        super().step()
        if self.now < before:
            raise InvariantError(f"the clock went back from {before} s to {self.now} s")
        for check in self.checks:
            check()


class FlowLog:
    """Every flow started on the links it observes (given to them at construction), per link."""

    def __init__(self) -> None:
        self.flows: dict[str, list[Flow]] = {}

    def flow_started(self, link: Link | Fabric, flow: Flow) -> None:
        self.flows.setdefault(link.name, []).append(flow)


class Invariants:
    """The rules, checked over a built deployment's `instances` and `links` in `env`; `flows` is
    the log its links were built with; `is_down(instance)`, with faults, whether it is down now."""

    def __init__(self, env: CheckedEnvironment, instances: list, links: list, flows: FlowLog,
                 is_down: Callable[[object], bool] | None = None):
        self.env = env
        self.instances = instances
        self.links = links
        self.flows = flows
        self.is_down = is_down
        env.checks.append(self.after_event)

    def after_event(self) -> None:
        is_down = self.is_down
        for inst in self.instances:
            # the pool's distinct tokens: a cached block that several requests' KV counts (a
            # shared prefix) takes room once, so requests' KV summed may exceed the pool
            used = inst.kv_pool_used
            if used > inst.capacity or inst.held < 0:
                raise InvariantError(f"{inst.name} at {self.env.now} s: KV pool use {used} tokens "
                                     f"(held {inst.held}) outside [0, {inst.capacity}]")
            if not inst.kv_load_floor <= inst.kv_load <= inst.kv_load_ceiling:   # routers rely on it
                raise InvariantError(f"{inst.name} at {self.env.now} s: KV load {inst.kv_load} outside "
                                     f"its bounds [{inst.kv_load_floor}, {inst.kv_load_ceiling}]")
            if is_down is not None and is_down(inst) and \
                    (used or inst.waiting or inst.prefilling or inst.inbound_tokens):
                raise InvariantError(f"{inst.name} at {self.env.now} s is down but holds work: "
                                     f"{used} KV tokens, {len(inst.waiting)} waiting, "
                                     f"{len(inst.prefilling)} prefilling, {inst.inbound_tokens} inbound")
        for link in self.links:
            if isinstance(link, Fabric):
                self._check_fabric(link)
                continue
            rate, active = link._rate, link._active
            if active < 0:
                raise InvariantError(f"{link.name}: {active} flows in flight")
            if link.flow_cap_Bps is not None and rate > link.flow_cap_Bps * (1 + REL):
                raise InvariantError(f"{link.name} at {self.env.now} s: a flow gets {rate} B/s, "
                                     f"over its cap of {link.flow_cap_Bps} B/s")
            if rate * active > link.capacity_Bps * (1 + REL):
                raise InvariantError(f"{link.name} at {self.env.now} s: {active} flows at {rate} B/s "
                                     f"exceed the {link.capacity_Bps} B/s left for them")

    def _check_fabric(self, fabric: Fabric) -> None:
        for port, load, capacity in fabric.port_loads():
            if load > capacity * (1 + REL):
                raise InvariantError(f"{port} at {self.env.now} s: its flows get {load} B/s, over "
                                     f"its {capacity} B/s")

    def request_ended(self, req) -> None:
        if req.failed is None and req.tokens_out != req.output_tokens:
            raise InvariantError(f"request {req.idx} completed with {req.tokens_out} of "
                                 f"{req.output_tokens} output tokens")
        if req.failed is not None and req.tokens_out > req.output_tokens:
            raise InvariantError(f"request {req.idx} failed after {req.tokens_out} of "
                                 f"{req.output_tokens} output tokens")

    def at_end(self, in_flight: dict) -> None:
        """Everything issued has ended, every instance is idle with its KV given back, and every
        link carried exactly what its flows sent."""
        if in_flight:
            raise InvariantError(f"{len(in_flight)} request(s) never ended, e.g. {next(iter(in_flight))}")
        for inst in self.instances:
            if inst.kv_in_use or inst.waiting or inst.prefilling:
                raise InvariantError(f"{inst.name} at the end: {inst.kv_in_use} KV tokens in use, "
                                     f"{len(inst.waiting)} waiting, {len(inst.prefilling)} prefilling")
        for link in self.links:
            flows = self.flows.flows.get(link.name, [])
            unfinished = sum(not f.done for f in flows)
            if unfinished:
                raise InvariantError(f"{link.name} at the end: {unfinished} flow(s) still in flight")
            sent = sum(f.sent for f in flows)
            if abs(sent - link.bytes_carried) > REL * max(sent, 1.0):
                raise InvariantError(f"{link.name}: carried {link.bytes_carried} bytes, its flows "
                                     f"sent {sent}")
