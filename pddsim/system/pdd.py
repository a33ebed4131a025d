"""The PDD pipeline: Prefill and Relay-Decode in cluster A, Main-Decode in cluster B.

After prefill the KV leaves on two paths at once: over RDMA to an RLD, which starts decoding and
streams the first tokens (TTFT no longer waits for the WAN), and over the WAN to an MD, carrying
only the blocks the MD's decode-side cache lacks. When the MD holds the prompt's KV, the RLD sends
the IDs of the tokens it produced; the MD recomputes their KV in an extend step of its own batch
and takes over the stream. A request whose RLD finishes first never needs the MD: its WAN transfer
is cancelled. During a catch-up handoff the request decodes on the RLD while a job on the MD that
does not stream absorbs the handed-over tokens, so each instance sees one job at a time. If the MD
cannot take such a part, catch-up stops there and the RLD finishes (or fails) the request itself.
"""
from __future__ import annotations

from functools import partial

from pddsim.engine import clock
from pddsim.engine.instance import Instance
from pddsim.engine.job import Job
from pddsim.engine.network import Flow, Link
from pddsim.engine.request import Request
from pddsim.system.faults import INSTANCE_FAILED
from pddsim.system.handoff import HANDOFFS
from pddsim.system.paths import PATH_POLICIES
from pddsim.system.pipelines import Disaggregated
from pddsim.system.routes import Route
from pddsim.system.stages import DECODE_STAGES, RELAY_STAGES


class PddRequestState:
    """One request's state in the PDD pipeline: where its KV went, how far its handoff is."""

    __slots__ = ("req", "p", "p_job", "rld", "rld_job", "md", "absorb", "wan_flow", "rld_flow",
                 "ids_flow", "transfers", "absorbed", "md_busy", "rounds", "final", "leftover",
                 "md_lost")

    def __init__(self, req: Request, p_job: Job, md: Instance | None):
        assert p_job.inst is not None
        self.req, self.p, self.p_job, self.md = req, p_job.inst, p_job, md
        self.rld: Instance | None = None
        self.rld_job: Job | None = None   # its decode on the RLD, once submitted
        self.absorb: Job | None = None    # the catch-up part the MD absorbs (or has absorbed)
        self.wan_flow: Flow | None = None   # the delta to the MD, until it lands
        self.rld_flow: Flow | None = None   # the prompt's KV on its way to the RLD
        self.ids_flow: Flow | None = None   # the last token IDs sent to the MD
        self.transfers = 0        # KV transfers out of P still in flight; P holds the KV till 0
        self.absorbed = 0         # generated tokens whose KV the MD already holds
        self.md_busy = False      # an extend is queued or running on the MD
        self.rounds = 0           # handoff messages sent
        self.final = False        # the last handoff has left the RLD
        self.leftover = False     # the request ended while work of it was under way
        self.md_lost = False      # its MD (or the WAN path to it) died: the RLD finishes it

    @property
    def the_md(self) -> Instance:
        assert self.md is not None, "a request handed to an MD has one"
        return self.md


class PDD(Disaggregated):
    # a PDD request's route is decided once its prefill is done (`prefill_done`); one that
    # fails before then has none
    route_at_arrival = ""

    def __init__(self, env, dep, routers, on_end, cfg, rng, tracer=None, faults=None):
        super().__init__(env, dep, routers, on_end, tracer, faults=faults)
        self.cfg = cfg
        self.paths = PATH_POLICIES[cfg.path_policy](cfg, rng)
        self.handoff = HANDOFFS[cfg.handoff](cfg)
        self._states: dict[Request, PddRequestState] = {}      # requests past their prefill
        self._leftovers: dict[PddRequestState, None] = {}   # ended requests' work on an MD

    @property
    def wan(self) -> Link:
        assert self.dep.wan is not None, "PDD's clusters are joined by a WAN (the config requires it)"
        return self.dep.wan

    # -- after prefill: pick the MD and the path ---------------------------------------------------
    def prefill_done(self, job: Job) -> None:
        req, p = job.req, job.inst
        assert p is not None
        pools = self.dep.pools
        faults = self.faults
        if not pools["decode"]:                 # every MD is down (faults): the RLD finishes it
            assert faults is not None
            if not pools["relay"]:              # no path left: try again
                p.release(job)
                faults.retry(req, INSTANCE_FAILED)
                return
        md = self.routers["decode"].pick(pools["decode"], req) if pools["decode"] else None
        st = self._states[req] = PddRequestState(req, job, md)
        if md is None:
            req.pipeline = Route.P_RLD
        elif faults is not None and faults.cfg.degraded == "finish_on_relay" and \
                faults.link_is_down(self.wan):
            req.pipeline = Route.P_RLD          # degraded mode: nothing can cross the WAN now
        else:
            lacking = (req.input_tokens - md.cached_tokens(req)) * self.dep.model.kv_bytes_per_token
            req.pipeline = self.paths.choose(req, lacking, self.wan)
        if req.pipeline != Route.P_MD and not pools["relay"]:    # every RLD is down (faults)
            req.pipeline = Route.P_MD
        if req.pipeline != Route.P_MD:
            rld = st.rld = self.routers["relay"].pick(self.dep.pools["relay"], req)
            st.transfers += 1
            st.rld_flow = self.ship_kv(req, p, rld, partial(self._relay_has_prompt, st), streams=True)
        if req.pipeline != Route.P_RLD:
            st.transfers += 1
            st.wan_flow = self.ship_kv(req, p, md, partial(self._md_has_prompt, st),
                                       streams=req.pipeline == Route.P_MD)

    def _transfer_done(self, st: PddRequestState) -> None:
        st.transfers -= 1
        if st.transfers == 0:
            st.p.release(st.p_job)

    def _relay_has_prompt(self, st: PddRequestState) -> None:
        self._transfer_done(st)
        if st.rld is not None:                  # not gone straight to the MD meanwhile
            st.rld_job = self.start_decode(st.req, st.rld, RELAY_STAGES)

    def _md_has_prompt(self, st: PddRequestState) -> None:
        req = st.req
        st.wan_flow = None
        self._transfer_done(st)
        if not st.md_lost:                      # (its last bytes may have flown as the MD died)
            self.kv_landed(req, st.md)
        if st.md_lost or req.finish_s is not None:   # or it finished on the RLD meanwhile
            self._leftover_done(st)
            return
        if req.pipeline != Route.P_MD and req.tokens_out == 0 and self._relay_not_started(st):
            self._leave_relay(st)               # the RLD has not started it: the MD can, now
            req.pipeline = Route.P_MD
        if req.pipeline == Route.P_MD:
            self.start_decode(req, st.md)
        else:
            self._next_handoff(st)

    def _leave_relay(self, st: PddRequestState) -> None:
        """The request no longer goes to its RLD: the prompt's copy still on the way there is
        cancelled (`_relay_has_prompt` finds the RLD gone if its last bytes are flying)."""
        flow = st.rld_flow
        if flow is not None and not flow.done:
            assert st.rld is not None
            self.dep.cancel(st.p, st.rld, flow)
            st.rld.add_inbound(-st.req.input_tokens)
            self._transfer_done(st)
        st.rld = None

    @staticmethod
    def _relay_not_started(st: PddRequestState) -> bool:
        """Its KV is still on the way to the RLD, or it waits there (taken back now)."""
        job = st.rld_job
        return job is None or job.inst is not st.rld or (st.rld is not None and st.rld.withdraw(job))

    # -- handoff: token IDs over the WAN, an extend step on the MD ----------------------------------
    def _next_handoff(self, st: PddRequestState) -> None:
        """At the RLD's next iteration boundary, hand over the backlog in part (catch-up: the RLD
        keeps decoding) or finally (the RLD stops there)."""
        assert st.rld is not None and st.rld_job is not None
        st.rld.at_boundary(st.rld_job, partial(self._handoff_at_boundary, st), leave=False)

    def _handoff_at_boundary(self, st: PddRequestState, _job: Job, made_here: int) -> None:
        if st.md_lost:                          # no MD to hand over to: the RLD decodes on
            return
        req = st.req
        backlog = req.tokens_out + made_here - st.absorbed
        # the next boundary, where a final handoff would leave, brings one more iteration's
        # tokens: at most k+1 under multi-token decoding, so the tail stays within the threshold
        assert st.rld is not None
        if self.handoff.catch_up(self.dep.pools["relay"], backlog + st.rld.most_tokens_per_iteration):
            self._send_ids(st, backlog, final=False)
        else:
            assert st.rld_job is not None
            st.rld.at_boundary(st.rld_job, lambda job, _made: self._send_ids(
                st, req.tokens_out - st.absorbed, final=True), leave=True)

    def _send_ids(self, st: PddRequestState, n_ids: int, *, final: bool) -> None:
        req = st.req
        st.rounds += 1
        st.md_busy = True
        if final:
            st.final = True
            req.enter("handoff", clock.now(self.env))
            req.relay_tokens = req.tokens_out
            req.handoff_tail_tokens = n_ids
        nbytes = n_ids * self.cfg.token_id_bytes
        req.wan_bytes += nbytes
        st.ids_flow = self.send(st.rld, st.md, nbytes, lambda: self._ids_arrived(st, n_ids, final),
                                req, "token IDs")

    def _ids_arrived(self, st: PddRequestState, n_ids: int, final: bool) -> None:
        req, md = st.req, st.the_md
        if st.md_lost:                          # they flew as the MD died: the RLD streams on
            return
        if req.finish_s is not None:
            st.md_busy = False
            self._md_drop(st)
            self._leftover_done(st)
            return
        context = req.input_tokens + st.absorbed
        self._md_drop(st)                       # the extend re-reserves prompt + tokens so far
        if final:                               # the MD takes the stream over: its request's stage
            job = Job(req, on_held=partial(self._extended, st), on_finished=self.finished,
                      on_failed=self.failed,    # stays the handoff until its first token
                      decode_stage=DECODE_STAGES[1])
            md.submit(job, prefill=max(n_ids, 1), decode=req.output_tokens - req.tokens_out,
                      context=context, hold=True)
            return
        st.absorb = Job(req, streams=False, on_held=partial(self._absorbed, st),
                        on_failed=partial(self._absorb_failed, st))
        md.submit(st.absorb, prefill=n_ids, decode=0, context=context, hold=True)

    def _absorbed(self, st: PddRequestState, job: Job) -> None:
        """The MD holds a catch-up part's KV: the RLD hands over the next backlog."""
        if self._extend_over(st, job):
            self._next_handoff(st)

    def _extended(self, st: PddRequestState, job: Job) -> None:
        """The MD holds the whole backlog's KV: it streams from here on."""
        if self._extend_over(st, job):
            req = st.req
            req.handoffs = st.rounds
            req.handoff_stall_s = clock.now(self.env) - req.last_token_s
            st.the_md.stream(job)

    def _extend_over(self, st: PddRequestState, job: Job) -> bool:
        """An extend on the MD is done: False if its request has ended meanwhile (let go)."""
        st.md_busy = False
        if st.req.finish_s is not None:
            self._md_drop(st)
            self._leftover_done(st)
            return False
        st.absorbed = job.context - st.req.input_tokens
        return True

    def _absorb_failed(self, st: PddRequestState, _job: Job, _reason: str) -> None:
        """The MD cannot absorb the handed-over tokens: no handoff follows, the RLD keeps the
        request."""
        st.absorb = None
        st.md_busy = False
        self._leftover_done(st)

    def _leftover_done(self, st: PddRequestState) -> None:
        if st.leftover:
            st.leftover = False
            del self._leftovers[st]
            self.leftover_done()

    def _md_drop(self, st: PddRequestState) -> None:
        """Free the KV a catch-up part holds on the MD."""
        if st.absorb is not None and st.absorb.reserved:
            st.the_md.release(st.absorb)

    # -- faults (system/faults.py) -------------------------------------------------------------
    def lost_with(self, req: Request, inst) -> bool:
        """The attempt is lost with the instance streaming or about to stream it: its P while
        the prompt's KV leaves for the instance that streams next, its RLD before the final
        handoff, its MD after it. An MD (or a P still sending the MD its delta) dying while the
        RLD streams costs only the handoff: the RLD finishes the request."""
        st = self._states.get(req)
        if st is None or st.final:
            return super().lost_with(req, inst) if st is None else st.md is inst
        if super().lost_with(req, inst) or st.rld is inst:   # (its KV may be on the way to the RLD)
            return True
        sends_md = st.p is inst and st.wan_flow is not None and not st.wan_flow.done
        if st.md is inst or sends_md:
            if st.rld is None:
                return True
            self._lose_md(st)
        return False

    def refers(self, req: Request, inst) -> bool:
        st = self._states.get(req)
        return super().refers(req, inst) or (st is not None and inst in (st.p, st.rld, st.md))

    def _lose_md(self, st: PddRequestState) -> None:
        """No handoff for this request: the RLD decodes it to the end."""
        req = st.req
        st.md_lost = True
        flow = st.wan_flow
        if flow is not None and not flow.done:
            self.wan.cancel(flow)
            req.wan_bytes -= flow.size - flow.sent
            req.wan_bytes_no_drc -= req.input_tokens * self.dep.model.kv_bytes_per_token - flow.sent
            st.wan_flow = None
            self._transfer_done(st)
        flow = st.ids_flow
        if flow is not None and not flow.done:
            self.wan.cancel(flow)
        st.absorb = None                        # its KV on the MD is lost with it
        st.md_busy = False

    def instance_lost(self, inst) -> None:
        """Ended requests' work on a dying MD (a catch-up part, a delta landing) is lost with it:
        nothing to drain."""
        for st in list(self._leftovers):
            if st.md is inst:
                st.md_lost = True               # a delta landing there finds it gone
                flow = st.ids_flow
                if flow is not None and not flow.done:
                    self.wan.cancel(flow)
                st.absorb = None
                st.md_busy = False
                self._leftover_done(st)

    def abandon_leftovers(self) -> None:
        """Token IDs of ended requests stalled on a line that never returns: cancelled, the
        catch-up KV they would have extended freed."""
        for st in list(self._leftovers):
            flow = st.ids_flow
            if flow is not None and not flow.done:
                self.wan.cancel(flow)
                st.md_busy = False
                self._md_drop(st)
                self._leftover_done(st)

    def transfer_stalled(self, req: Request, flow) -> None:
        """The MD's delta or catch-up IDs stalled while the RLD streams: it finishes the request;
        anything the stream waits for is tried again."""
        st = self._states.get(req)
        if st is not None and st.rld is not None and not st.final and flow is not st.rld_flow:
            self._lose_md(st)
        else:
            super().transfer_stalled(req, flow)

    def abandon(self, req: Request) -> None:
        """A fault ends the request's attempt: its transfers in flight are cancelled (the prompt's
        to the RLD, token IDs to the MD) and the rest let go as when it ends."""
        req.finish_s = clock.now(self.env)             # the attempt is over: late deliveries let go
        st = self._states.pop(req, None)
        if st is None:
            return
        self._leave_relay(st)
        flow = st.ids_flow
        if flow is not None and not flow.done and st.md_busy:
            self.wan.cancel(flow)
            st.md_busy = False
        self._let_go(st)

    def _end(self, req: Request) -> None:
        """However a request ends, what it no longer needs is let go: a request that ends before
        its final handoff ended on the RLD, and its WAN transfer is cancelled (bandwidth freed)."""
        st = self._states.pop(req, None)
        if st is not None:
            if st.rld is not None and not st.final:
                req.relay_tokens = req.tokens_out
                req.pipeline = Route.P_RLD
            if req.finish_s is None:            # not let go already (`abandon`)
                self._let_go(st)
        super()._end(req)

    def _let_go(self, st: PddRequestState) -> None:
        req = st.req
        flow = st.wan_flow
        if flow is not None and not flow.done:
            self.wan.cancel(flow)
            req.wan_bytes -= flow.size - flow.sent  # only what left before the cancel crossed
            # without the DRC the same time would have carried as much of the whole prompt
            req.wan_bytes_no_drc -= req.input_tokens * self.dep.model.kv_bytes_per_token - flow.sent
            self._transfer_done(st)
        elif flow is not None:                  # its last bytes are flying: P frees the KV as they land
            self._leftover(st)
            return
        if not st.md_busy:
            self._md_drop(st)
        elif st.absorb is not None and st.the_md.withdraw(st.absorb):   # queued: never runs
            st.md_busy = False
            self._md_drop(st)
        else:                                   # IDs in flight or an extend running: it drains
            self._leftover(st)

    def _leftover(self, st: PddRequestState) -> None:
        """The ended request's work goes on after it; the run waits for it to let go."""
        st.leftover = True
        self.leftovers += 1
        self._leftovers[st] = None
