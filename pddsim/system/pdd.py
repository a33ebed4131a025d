"""The PDD pipeline: Prefill and Relay-Decode in cluster A, Main-Decode in cluster B.

After prefill the KV leaves on two paths at once: over RDMA to an RLD, which starts decoding and
streams the first tokens (TTFT no longer waits for the WAN), and over the WAN to an MD, carrying
only the blocks the MD's decode-side cache lacks. When the MD holds the prompt's KV, the RLD sends
the IDs of the tokens it produced; the MD recomputes their KV in an extend step of its own batch
and takes over the stream. A request whose RLD finishes first never needs the MD: its WAN transfer
is cancelled. During a catch-up handoff the request decodes on the RLD while a shadow job of it
absorbs the handed-over tokens on the MD, so each instance sees one job at a time. A shadow is not
the request: it never ends it. If the MD cannot take a shadow, catch-up stops there and the RLD
finishes (or fails) the request itself.
"""
from __future__ import annotations

from pddsim.engine.network import Link
from pddsim.engine.request import Request, Route
from pddsim.system.faults import INSTANCE_FAILED
from pddsim.system.handoff import HANDOFFS
from pddsim.system.paths import PATH_POLICIES
from pddsim.system.pipelines import Disaggregated


class PddRequestState:
    """One request's state in the PDD pipeline: where its KV went, how far its handoff is."""

    __slots__ = ("req", "p", "p_held", "rld", "md", "shadow", "wan_flow", "rld_flow", "ids_flow",
                 "transfers", "absorbed", "md_busy", "rounds", "final", "leftover", "md_lost")

    def __init__(self, req, p, md):
        self.req, self.p, self.md, self.rld = req, p, md, None
        self.p_held = req.reserved  # P's KV for the prompt, freed once both paths have sent it
        req.reserved = 0
        self.shadow = None        # the catch-up job absorbing tokens on the MD
        self.wan_flow = None
        self.rld_flow = None      # the prompt's KV on its way to the RLD
        self.ids_flow = None      # the last token IDs sent to the MD
        self.transfers = 0        # KV transfers out of P still in flight
        self.absorbed = 0         # generated tokens whose KV the MD already holds
        self.md_busy = False      # an extend is queued or running on the MD
        self.rounds = 0           # handoff messages sent
        self.final = False        # the last handoff has left the RLD
        self.leftover = False     # the request ended while a catch-up part was under way
        self.md_lost = False      # its MD (or the WAN path to it) died: the RLD finishes it


class PDD(Disaggregated):
    def __init__(self, env, routers, on_end, cfg, rng):
        super().__init__(env, routers, on_end)
        self.cfg = cfg
        self.paths = PATH_POLICIES[cfg.path_policy](cfg, rng)
        self.handoff = HANDOFFS[cfg.handoff](cfg)
        self._leftovers: dict[PddRequestState, None] = {}   # ended requests' work on an MD

    def failed(self, job: Request, inst, reason: str) -> None:
        st = job.state
        if st is not None and job is st.shadow:    # the MD cannot absorb the handed-over tokens
            st.shadow = None
            st.md_busy = False                     # no handoff follows: the RLD keeps the request
            self._leftover_done(st)
            return
        super().failed(job, inst, reason)

    @property
    def wan(self) -> Link:
        assert self.dep.wan is not None, "PDD's clusters are joined by a WAN (the config requires it)"
        return self.dep.wan

    def prefill_done(self, job: Request, inst) -> None:
        if inst.role == "decode":
            self._extend_done(job, inst)
        else:
            self._after_prefill(job, inst)

    # -- after prefill: pick the MD and the path ---------------------------------------------------
    def _after_prefill(self, req: Request, p) -> None:
        pools = self.dep.pools
        faults = self.faults
        if not pools["decode"]:                 # every MD is down (faults): the RLD finishes it
            assert faults is not None
            if not pools["relay"]:              # no path left: try again
                p.release(req)
                faults.retry(req, INSTANCE_FAILED)
                return
        md = self.routers["decode"].pick(pools["decode"], req) if pools["decode"] else None
        st = req.state = PddRequestState(req, p, md)
        if md is None:
            req.pipeline = Route.P_RLD
        elif faults is not None and faults.cfg.degraded == "finish_on_relay" and \
                faults.link_is_down(self.wan):
            req.pipeline = Route.P_RLD          # degraded mode: nothing can cross the WAN now
        else:
            lacking = (req.input_tokens - md.cached_tokens(req)) * self.dep.model.kv_bytes_per_token
            req.pipeline = self.paths.choose(req, lacking, self.dep.wan)
        if req.pipeline != Route.P_MD and not pools["relay"]:    # every RLD is down (faults)
            req.pipeline = Route.P_MD
        if req.pipeline != Route.P_MD:
            st.rld = self.routers["relay"].pick(self.dep.pools["relay"], req)
            st.transfers += 1
            st.rld_flow = self.ship_kv(req, p, st.rld, lambda: self._relay_has_prompt(req),
                                       streams=True)
        if req.pipeline != Route.P_RLD:
            st.transfers += 1
            st.wan_flow = self.ship_kv(req, p, md, lambda: self._md_has_prompt(req),
                                      streams=req.pipeline == Route.P_MD)

    def _transfer_done(self, req: Request) -> None:
        st = req.state
        st.transfers -= 1
        if st.transfers == 0:
            st.p.free(st.p_held, req)

    def _relay_has_prompt(self, req: Request) -> None:
        self._transfer_done(req)
        if req.state.rld is not None:           # not gone straight to the MD meanwhile
            self.start_decode(req, req.state.rld)

    def _md_has_prompt(self, req: Request) -> None:
        st = req.state
        st.wan_flow = None
        self._transfer_done(req)
        if not st.md_lost:                      # (its last bytes may have flown as the MD died)
            self.kv_landed(req, st.md)
        if st.md_lost or req.finish_s is not None:   # or it finished on the RLD meanwhile
            self._leftover_done(st)
            return
        if req.pipeline != Route.P_MD and req.tokens_out == 0 and (
                req.inst is not st.rld or st.rld.withdraw(req)):  # type: ignore[union-attr]
            st.rld = None                       # the RLD has not started it: the MD can, now
            req.pipeline = Route.P_MD
        if req.pipeline == Route.P_MD:
            self.start_decode(req, st.md)
        else:
            self._next_handoff(req)

    # -- handoff: token IDs over the WAN, an extend step on the MD ----------------------------------
    def _next_handoff(self, req: Request) -> None:
        """At the RLD's next iteration boundary, hand over the backlog in part (catch-up: the RLD
        keeps decoding) or finally (the RLD stops there)."""
        req.state.rld.at_boundary(req, self._handoff_at_boundary, leave=False)

    def _handoff_at_boundary(self, req: Request, made_here: int) -> None:
        st = req.state
        if st.md_lost:                          # no MD to hand over to: the RLD decodes on
            return
        backlog = req.tokens_out + made_here - st.absorbed
        # the next boundary, where a final handoff would leave, brings one more token
        if self.handoff.catch_up(self.dep.pools["relay"], backlog + 1):
            self._send_ids(req, backlog, final=False)
        else:
            st.rld.at_boundary(req, lambda r, _made: self._send_ids(r, r.tokens_out - st.absorbed,
                                                                    final=True), leave=True)

    def _send_ids(self, req: Request, n_ids: int, *, final: bool) -> None:
        st = req.state
        st.rounds += 1
        st.md_busy = True
        if final:
            st.final = True
            req.enter("handoff", self.env.now)
            req.relay_tokens = req.tokens_out
            req.handoff_tail_tokens = n_ids
        nbytes = n_ids * self.cfg.token_id_bytes
        req.wan_bytes += nbytes
        st.ids_flow = self.send(st.rld, st.md, nbytes, lambda: self._ids_arrived(req, n_ids, final),
                                req, "token IDs")

    def _ids_arrived(self, req: Request, n_ids: int, final: bool) -> None:
        st = req.state
        if st.md_lost:                          # they flew as the MD died: the RLD streams on
            return
        if req.finish_s is not None:
            st.md_busy = False
            self._md_drop(st)
            self._leftover_done(st)
            return
        context = req.input_tokens + st.absorbed
        self._md_drop(st)                       # the extend re-reserves prompt + tokens so far
        if final:
            st.md.submit(req, prefill=max(n_ids, 1), decode=req.output_tokens - req.tokens_out,
                         context=context, hold=True)
            return
        if st.shadow is None:
            st.shadow = Request(req.idx, req.trace, req.arrival_s)
            st.shadow.state = st
        st.md.submit(st.shadow, prefill=n_ids, decode=0, context=context, hold=True)

    def _extend_done(self, job: Request, md) -> None:
        st = job.state
        req = st.req
        st.md_busy = False
        if req.finish_s is not None:
            self._md_drop(st)
            self._leftover_done(st)
            return
        st.absorbed = job.context - req.input_tokens
        if job is not req:                      # a catch-up part: the RLD is still streaming
            self._next_handoff(req)
            return
        req.handoffs = st.rounds
        req.handoff_stall_s = self.env.now - req.last_token_s
        md.stream(req)

    def _leftover_done(self, st: PddRequestState) -> None:
        if st.leftover:
            st.leftover = False
            del self._leftovers[st]
            self.leftover_done()

    def _md_drop(self, st: PddRequestState) -> None:
        """Free the KV a catch-up shadow holds on the MD."""
        if st.shadow is not None and st.shadow.reserved:
            st.md.release(st.shadow)

    # -- faults (system/faults.py) -------------------------------------------------------------
    def lost_with(self, req: Request, inst) -> bool:
        """The attempt is lost with the instance streaming or about to stream it: its P while
        the prompt's KV leaves for the instance that streams next, its RLD before the final
        handoff, its MD after it. An MD (or a P still sending the MD its delta) dying while the
        RLD streams costs only the handoff: the RLD finishes the request."""
        st = req.state
        if st is None or st.final:
            return req.inst is inst if st is None else st.md is inst
        if req.inst is inst or st.rld is inst:   # (its prompt's KV may be on the way to the RLD)
            return True
        sends_md = st.p is inst and st.wan_flow is not None and not st.wan_flow.done
        if st.md is inst or sends_md:
            if st.rld is None:
                return True
            self._lose_md(req)
        return False

    def _lose_md(self, req: Request) -> None:
        """No handoff for this request: the RLD decodes it to the end."""
        st = req.state
        st.md_lost = True
        flow = st.wan_flow
        if flow is not None and not flow.done:
            self.wan.cancel(flow)
            req.wan_bytes -= flow.size - flow.sent
            req.wan_bytes_no_drc -= req.input_tokens * self.dep.model.kv_bytes_per_token - flow.sent
            st.wan_flow = None
            self._transfer_done(req)
        flow = st.ids_flow
        if flow is not None and not flow.done:
            self.wan.cancel(flow)
        st.shadow = None                        # its KV on the MD is lost with it
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
                st.shadow = None
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
        st = req.state
        if st is not None and st.rld is not None and not st.final and flow is not st.rld_flow:
            self._lose_md(req)
        else:
            super().transfer_stalled(req, flow)

    def abandon(self, req: Request) -> None:
        """A fault ends the request's attempt: its transfers in flight are cancelled (the prompt's
        to the RLD, token IDs to the MD) and the rest let go as when it ends."""
        st = req.state
        req.finish_s = self.env.now             # the attempt is over: late deliveries let go
        if st is None:
            return
        flow = st.rld_flow
        if flow is not None and not flow.done:
            self.dep.carrier(st.p, st.rld).cancel(flow)
            st.rld.add_inbound(-req.input_tokens)
            self._transfer_done(req)
        st.rld = None                           # `_relay_has_prompt` finds it gone
        flow = st.ids_flow
        if flow is not None and not flow.done and st.md_busy:
            self.wan.cancel(flow)
            st.md_busy = False
        self._let_go(req)

    def _end(self, req: Request) -> None:
        """However a request ends, what it no longer needs is let go: a request that ends before
        its final handoff ended on the RLD, and its WAN transfer is cancelled (bandwidth freed)."""
        st = req.state
        if st is not None and st.rld is not None and not st.final:
            req.relay_tokens = req.tokens_out
            req.pipeline = Route.P_RLD
        if req.finish_s is None:                # not let go already (`abandon`)
            self._let_go(req)
        super()._end(req)

    def _let_go(self, req: Request) -> None:
        st = req.state
        if st is not None:
            flow = st.wan_flow
            if flow is not None and not flow.done:
                self.wan.cancel(flow)
                req.wan_bytes -= flow.size - flow.sent  # only what left before the cancel crossed
                # without the DRC the same time would have carried as much of the whole prompt
                req.wan_bytes_no_drc -= req.input_tokens * self.dep.model.kv_bytes_per_token - flow.sent
                self._transfer_done(req)
            elif flow is not None:              # its last bytes are flying: P frees the KV as they land
                self._leftover(st)
                return
            if not st.md_busy:
                self._md_drop(st)
            elif st.shadow is not None and st.md.withdraw(st.shadow):   # queued: never runs
                st.md_busy = False
                self._md_drop(st)
            else:                               # IDs in flight or an extend running: it drains
                self._leftover(st)

    def _leftover(self, st: PddRequestState) -> None:
        """The ended request's work goes on after it; the run waits for it to let go."""
        st.leftover = True
        self.leftovers += 1
        self._leftovers[st] = None
