"""How a request travels through a deployment. Each system is a pipeline: it dispatches arrivals to
a pool as jobs (engine/job.py), and each job tells it when its prefill is done and its KV held,
when it finishes, or when it cannot be served. Every request ends exactly once, through `_end`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import simpy

from pddsim.engine import clock
from pddsim.engine.instance import Instance
from pddsim.engine.job import Job
from pddsim.engine.network import Flow
from pddsim.engine.request import Request
from pddsim.system.deployment import Deployment
from pddsim.system.faults import TRANSFER_TIMEOUT, FaultInjector
from pddsim.system.routes import Route
from pddsim.system.stages import DECODE_STAGES, ENTRY_STAGES

# builds a run's FaultInjector for the pipeline it acts on (the pipeline is built with it)
FaultsFactory = Callable[["Pipeline"], FaultInjector]


class Pipeline:
    def __init__(self, env, dep: Deployment, routers: dict, on_end: Callable[[Request], None],
                 tracer=None, faults: FaultsFactory | None = None):
        """`tracer`: a timeline told of every transfer, when one is kept; `faults`: builds the
        run's FaultInjector, when faults are configured."""
        self.env = env
        self.dep = dep
        self.routers = routers
        self.on_end = on_end
        self.tracer = tracer
        self.leftovers = 0                   # work of ended requests still running (it drains)
        self._drained: simpy.Event | None = None
        self.faults = None if faults is None else faults(self)

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
            t0 = clock.now(self.env)

            def arrived():
                self.tracer.transfer(self.dep.carrier(src, dst), t0, clock.now(self.env), nbytes, req.idx,
                                     what)
                on_arrival()
            flow = self.dep.send(src, dst, nbytes, arrived)
        if self.faults is not None and self.faults.cfg.transfer_timeout_s is not None:
            def timed_out(_e) -> None:
                if not flow.done and req.finish_s is None:
                    self.transfer_stalled(req, flow)
            clock.timeout(self.env, self.faults.cfg.transfer_timeout_s, then=timed_out)
        return flow

    def dispatch(self, req: Request) -> None:
        raise NotImplementedError

    def job(self, req: Request, stages: tuple[str, str], on_held: Callable[[Job], None] | None = None,
            ) -> Job:
        """A job streaming `req` (its queue and decode stages), whose end is the request's."""
        if on_held is None:
            return Job(req, self.failed, self.finished, stages[0], stages[1])
        return Job(req, self.failed, self.finished, stages[0], stages[1], on_held)

    def finished(self, job: Job) -> None:
        self._end(job.req)

    def failed(self, job: Job, reason: str) -> None:
        assert job.inst is not None
        job.req.failed = f"{job.inst.name}: {reason}"
        self._end(job.req)

    def give_up(self, req: Request, reason: str) -> None:
        """End a request that cannot go on (a fault): what its attempt holds is let go (its job
        taken back if it still waits for an instance), and it fails with `reason`."""
        job = req.job
        if job is not None and job.inst is not None:
            job.inst.withdraw(job)
        self.abandon(req)
        req.failed = reason
        self._end(req)

    def abandon(self, req: Request) -> None:
        """Let go of whatever the request's attempt holds outside the instance it is on: nothing
        in a pipeline that keeps no transfers."""

    def lost_with(self, req: Request, inst) -> bool:
        """Does `inst` dying lose the request's attempt (before it is wiped)?"""
        return req.job is not None and req.job.inst is inst

    def refers(self, req: Request, inst) -> bool:
        """Will `req` still use `inst`: its job is on it, or the pipeline's state for it names it
        (a transfer's ends, a PDD request's P, RLD or MD)?"""
        return req.job is not None and req.job.inst is inst

    def instance_lost(self, inst) -> None:
        """`inst` is about to be wiped: work of ended requests on it is lost too."""

    def abandon_leftovers(self) -> None:
        """The run is over and ended requests' work is stalled for good (faults): let it go."""

    def transfer_stalled(self, req: Request, flow) -> None:
        """A transfer of the request outlived `faults.transfer_timeout_s`: it is tried again."""
        assert self.faults is not None
        self.faults.retry(req, TRANSFER_TIMEOUT)

    def _end(self, req: Request) -> None:
        req.finish_s = clock.now(self.env)
        req.close_stages(clock.now(self.env))
        job = req.job
        if job is not None:                  # it is over; and the request no longer refers to it,
            job.inst = req.job = None        # so neither is kept alive by the other (a cycle)
        self.on_end(req)


class Colocated(Pipeline):
    """Prefill and decode in one instance (Sarathi-style mixed batches): the non-disaggregated baseline."""

    def dispatch(self, req: Request) -> None:
        req.pipeline = Route.COLOCATED
        inst = self.routers["prefill"].pick(self.dep.pools["colocated"], req)
        inst.submit(self.job(req, ENTRY_STAGES), prefill=req.input_tokens, decode=req.output_tokens,
                    context=0, use_cache=True)


@dataclass(slots=True)
class Shipment:
    """A PD request's prompt KV on its way from its prefill instance to its decoder."""
    p: Instance
    p_job: Job                           # holds the KV on `p` until it has landed
    d: Instance | None = None            # None: parked until a decoder is up (faults)
    flow: Flow | None = None


class Disaggregated(Pipeline):
    """PD: prefill on a prefill instance, the KV the decode side lacks shipped over RDMA (same
    cluster) or the WAN, decode on a decode instance, which streams to the user. The first token,
    made by the prefill, reaches the user when the decode instance takes the request.

    Selective offload (`offload_above_tokens`, Prefill-as-a-Service): prompts longer than it are
    prefilled in the cluster without decoders, the rest beside the decoders; when every instance
    of a side is down, the other side takes its prompts."""

    def __init__(self, env, dep: Deployment, routers: dict, on_end: Callable[[Request], None],
                 tracer=None, offload_above_tokens: int | None = None,
                 faults: FaultsFactory | None = None):
        super().__init__(env, dep, routers, on_end, tracer, faults)
        self.offload_above_tokens = offload_above_tokens
        self._shipping: dict[Request, Shipment] = {}

    # PD has one route, decided as a request arrives ("": none until the system decides it)
    route_at_arrival: str = Route.P_D

    def offload_side(self, req: Request, pool: list[Instance]) -> list[Instance]:
        """The prefill instances of the prompt's side under selective offload (all when that
        side has none up)."""
        assert self.offload_above_tokens is not None
        local = {d.cluster for d in self.dep.pools["decode"]}
        remote = req.input_tokens > self.offload_above_tokens
        side = [p for p in pool if (p.cluster not in local) == remote]
        return side or pool

    def dispatch(self, req: Request) -> None:
        req.pipeline = self.route_at_arrival
        pool: list[Instance] = self.dep.pools["prefill"]
        if self.offload_above_tokens is not None:
            pool = self.offload_side(req, pool)
        inst = self.routers["prefill"].pick(pool, req)
        inst.submit(self.job(req, ENTRY_STAGES, on_held=self.prefill_done), prefill=req.input_tokens,
                    decode=0, context=0, use_cache=True, hold=True)

    def prefill_done(self, job: Job) -> None:
        req, p = job.req, job.inst
        assert p is not None
        if not self.dep.pools["decode"]:          # every decode instance is down (faults):
            assert self.faults is not None        # its KV waits on P for one to restart
            self._shipping[req] = Shipment(p, job)
            self.faults.park(req, lambda: self.prefill_done(job))
            return
        d = self.routers["decode"].pick(self.dep.pools["decode"], req)
        st = self._shipping[req] = Shipment(p, job, d)
        st.flow = self.ship_kv(req, p, d, lambda: self._kv_arrived(st), streams=True)

    def lost_with(self, req: Request, inst) -> bool:
        st = self._shipping.get(req)
        return super().lost_with(req, inst) or (st is not None and st.d is inst)

    def refers(self, req: Request, inst) -> bool:
        st = self._shipping.get(req)
        return super().refers(req, inst) or (st is not None and inst in (st.p, st.d))

    def abandon(self, req: Request) -> None:
        """A prompt's KV on its way: the transfer is cancelled, the prefill side frees it."""
        st = self._shipping.pop(req, None)   # its delivery, if under way, finds it abandoned
        if st is None:
            return
        flow = st.flow
        if flow is not None and not flow.done:
            assert st.d is not None
            self.dep.cancel(st.p, st.d, flow)
            if st.p.cluster == st.d.cluster:
                st.d.add_inbound(-req.input_tokens)
        st.p.release(st.p_job)

    def ship_kv(self, req: Request, src, dst, on_arrival, *, streams: bool) -> Flow:
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
            req.enter("kv_wan" if src.cluster != dst.cluster else "kv_rdma", clock.now(self.env))
        if not streams or src.cluster != dst.cluster:
            return self.send(src, dst, nbytes, on_arrival, req, "prompt KV")
        # inside a cluster the pick decides whose NICs the KV crosses: a router sees it coming
        dst.add_inbound(req.input_tokens)

        def landed():
            dst.add_inbound(-req.input_tokens)
            on_arrival()
        return self.send(src, dst, nbytes, landed, req, "prompt KV")

    def _kv_arrived(self, st: Shipment) -> None:
        req = st.p_job.req
        if self._shipping.get(req) is not st:    # abandoned (a fault) while its last bytes flew
            return
        del self._shipping[req]
        st.flow = None                       # (its delivery refers to it: no cycle left behind)
        st.p.release(st.p_job)
        assert st.d is not None
        self.kv_landed(req, st.d)
        self.start_decode(req, st.d, job=st.p_job)

    @staticmethod
    def kv_landed(req: Request, dst) -> None:
        """The prompt's KV is on `dst`: its decode-side cache (if any) keeps it for later turns."""
        dst.keep_in_cache(req)

    def start_decode(self, req: Request, d, stages: tuple[str, str] = DECODE_STAGES,
                     job: Job | None = None) -> Job | None:
        """`d` holds the prompt's KV: it streams the prefill's token, then decodes the rest (its
        job; None when that token was the last). `job`: the request's job that has let go of its
        instance, to go on with here (one object fewer per request: the event loop's cost)."""
        if req.output_tokens == 1:
            req.emit(clock.now(self.env))
            self._end(req)
            return None
        if job is None:
            job = self.job(req, stages)
        else:
            job.queue_stage, job.decode_stage = stages
        d.submit(job, prefill=0, decode=req.output_tokens - 1, context=req.input_tokens + 1, ready=1)
        return job
