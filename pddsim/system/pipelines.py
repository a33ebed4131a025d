"""How a request travels through a deployment. Each system is a pipeline: it dispatches arrivals to
a pool, and instances call it back when a request's prefill is done, when it finishes, or when it
cannot be served. Every request ends exactly once, through `_end`."""
from __future__ import annotations

from typing import Callable

from pddsim.engine.request import Request, Route
from pddsim.system.deployment import Deployment
from pddsim.system.faults import TRANSFER_TIMEOUT


class Pipeline:
    def __init__(self, env, routers: dict, on_end: Callable[[Request], None]):
        self.env = env
        self.routers = routers
        self.on_end = on_end
        self.dep: Deployment                 # set once built: instances need the pipeline first
        self.tracer = None                   # a timeline told of every transfer, when one is kept
        self.leftovers = 0                   # work of ended requests still running (it drains)
        self._drained = None
        self.faults = None                   # the run's FaultInjector, when faults are configured

    def leftover_done(self) -> None:
        """One piece of an ended request's work has let go of what it held."""
        self.leftovers -= 1
        if self.leftovers == 0 and self._drained is not None:
            self._drained.succeed()

    def drained(self):
        """An event for when the leftovers of ended requests have let go of their resources, so
        a run ends with every instance back to what its caches hold."""
        self._drained = self.env.event()
        if self.leftovers == 0:
            self._drained.succeed()
        return self._drained

    def send(self, src, dst, nbytes: float, on_arrival, req: Request, what: str):
        """Start a transfer for `req` from instance `src` to `dst`; a timeline, if kept, draws it
        once delivered."""
        if self.tracer is None:
            flow = self.dep.send(src, dst, nbytes, on_arrival)
        else:
            t0 = self.env.now

            def arrived():
                self.tracer.transfer(self.dep.carrier(src, dst), t0, self.env.now, nbytes, req.idx,
                                     what)
                on_arrival()
            flow = self.dep.send(src, dst, nbytes, arrived)
        if self.faults is not None and self.faults.cfg.transfer_timeout_s is not None:
            self.env.timeout(self.faults.cfg.transfer_timeout_s).callbacks.append(
                lambda _e: flow.done or req.finish_s is not None or self.transfer_stalled(req, flow))
        return flow

    def dispatch(self, req: Request) -> None:
        raise NotImplementedError

    def prefill_done(self, req: Request, inst) -> None:
        raise NotImplementedError

    def finished(self, req: Request, inst) -> None:
        self._end(req)

    def failed(self, req: Request, inst, reason: str) -> None:
        req.failed = f"{inst.name}: {reason}"
        self._end(req)

    def give_up(self, req: Request, reason: str) -> None:
        """End a request that cannot go on (a fault): what its attempt holds is let go, and it
        fails with `reason`."""
        self.abandon(req)
        req.failed = reason
        self._end(req)

    def abandon(self, req: Request) -> None:
        """Let go of whatever the request's attempt holds outside the instance it is on: nothing
        in a pipeline that keeps no transfers."""

    def lost_with(self, req: Request, inst) -> bool:
        """Does `inst` dying lose the request's attempt (before it is wiped)?"""
        return req.inst is inst

    def instance_lost(self, inst) -> None:
        """`inst` is about to be wiped: work of ended requests on it is lost too."""

    def abandon_leftovers(self) -> None:
        """The run is over and ended requests' work is stalled for good (faults): let it go."""

    def transfer_stalled(self, req: Request, flow) -> None:
        """A transfer of the request outlived `faults.transfer_timeout_s`: it is tried again."""
        assert self.faults is not None
        self.faults.retry(req, TRANSFER_TIMEOUT)

    def _end(self, req: Request) -> None:
        req.finish_s = self.env.now
        req.close_stages(self.env.now)
        req.inst = None
        self.on_end(req)


class Colocated(Pipeline):
    """Prefill and decode in one instance (Sarathi-style mixed batches): the non-disaggregated baseline."""

    def dispatch(self, req: Request) -> None:
        req.pipeline = Route.COLOCATED
        inst = self.routers["prefill"].pick(self.dep.pools["colocated"], req)
        inst.submit(req, prefill=req.input_tokens, decode=req.output_tokens, context=0, use_cache=True)


class Disaggregated(Pipeline):
    """PD: prefill on a prefill instance, the KV the decode side lacks shipped over RDMA (same
    cluster) or the WAN, decode on a decode instance, which streams to the user. The first token,
    made by the prefill, reaches the user when the decode instance takes the request."""

    def dispatch(self, req: Request) -> None:
        req.pipeline = Route.P_D
        inst = self.routers["prefill"].pick(self.dep.pools["prefill"], req)
        inst.submit(req, prefill=req.input_tokens, decode=0, context=0, use_cache=True, hold=True)

    def prefill_done(self, req: Request, p) -> None:
        if not self.dep.pools["decode"]:          # every decode instance is down (faults):
            assert self.faults is not None        # its KV waits on P for one to restart
            req.state = (p, None, None)
            self.faults.park(req, lambda: self.prefill_done(req, p))
            return
        d = self.routers["decode"].pick(self.dep.pools["decode"], req)
        req.state = (p, d, None)             # first: KV the decode side holds whole lands at once
        flow = self.ship_kv(req, p, d, lambda: self._kv_arrived(req, p, d), streams=True)
        if req.state is not None:            # still on its way
            req.state = (p, d, flow)

    def lost_with(self, req: Request, inst) -> bool:
        return req.inst is inst or (req.state is not None and req.state[1] is inst)

    def abandon(self, req: Request) -> None:
        """A prompt's KV on its way: the transfer is cancelled, the prefill side frees it."""
        if req.state is None:
            return
        p, d, flow = req.state
        req.state = None                     # its delivery, if under way, finds it abandoned
        if flow is not None and not flow.done:
            self.dep.carrier(p, d).cancel(flow)
            if p.cluster == d.cluster:
                d.add_inbound(-req.input_tokens)
        p.release(req)

    def ship_kv(self, req: Request, src, dst, on_arrival, *, streams: bool) -> object:
        """Send the prompt KV that `dst` lacks (a decode-side cache holds the rest). `streams`:
        `dst` is where the user's stream goes next, so the request waits on this transfer."""
        have = dst.cached_tokens(req)
        if dst.cache is not None:
            req.hit_tokens_decode = have
        kv = self.dep.model.kv_bytes_per_token
        nbytes = (req.input_tokens - have) * kv
        if src.cluster != dst.cluster:
            req.wan_bytes += nbytes
            req.wan_bytes_no_drc += req.input_tokens * kv
        else:
            req.rdma_bytes += nbytes
        if streams:
            req.enter("kv_wan" if src.cluster != dst.cluster else "kv_rdma", self.env.now)
        if not streams or src.cluster != dst.cluster:
            return self.send(src, dst, nbytes, on_arrival, req, "prompt KV")
        # inside a cluster the pick decides whose NICs the KV crosses: a router sees it coming
        dst.add_inbound(req.input_tokens)

        def landed():
            dst.add_inbound(-req.input_tokens)
            on_arrival()
        return self.send(src, dst, nbytes, landed, req, "prompt KV")

    def _kv_arrived(self, req: Request, p, d) -> None:
        if req.state is None:                # abandoned (a fault) while its last bytes flew
            return
        req.state = None
        p.release(req)
        self.kv_landed(req, d)
        self.start_decode(req, d)

    @staticmethod
    def kv_landed(req: Request, dst) -> None:
        """The prompt's KV is on `dst`: its decode-side cache (if any) keeps it for later turns."""
        dst.keep_in_cache(req)

    def start_decode(self, req: Request, d) -> None:
        """`d` holds the prompt's KV: it streams the prefill's token, then decodes the rest."""
        if req.output_tokens == 1:
            req.emit(self.env.now)
            self._end(req)
            return
        d.submit(req, prefill=0, decode=req.output_tokens - 1, context=req.input_tokens + 1, ready=1)
