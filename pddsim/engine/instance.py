"""One serving instance: continuous batching with chunked prefill over paged KV memory.

The engine schedules one SimPy event per *segment* and runs on in that event's callback: a single
iteration when prefill chunks are in the batch, or k identical-membership decode iterations at once
(k stops at the next request to finish or at the memory limit). The performance model prices such a
run in closed form, and a request's tokens are derived arithmetically: it records the iteration
index at which it joined, and on leaving it has produced (now - join) tokens. A request arriving
mid-segment cuts the segment at the next iteration boundary: new work joins a batch only there, as
in a real engine. (Callbacks rather than a generator process: no generator is resumed, nor an
interrupt thrown into one, at every segment; a cut reschedules the run's end where it happens.)

Work on an instance is uniform: `prefill_left` tokens to compute (a prompt, a recompute after
preemption, or the token IDs of an extend-decode handoff), whose last chunk yields one token, then
`decode_left` tokens one per iteration; or, with `hold`, the computed KV is kept for the pipeline
(a prefill whose KV will be shipped, a catch-up batch absorbed before the stream moves over).
A decoder can be asked to leave (a handoff); like a join, that happens at an iteration boundary.
With multi-token decoding (`multi_token`) a decoder makes 1 to k+1 tokens an iteration, drawn when
it joins: tokens and KV growth are then read from those draws, not from the iteration count.

A prefix cache lives in a memory tier. In HBM it shares the KV pool: a block a request uses is pinned
and counted once, in that request's reservation; the blocks nobody uses count as the cache's and
are evicted (least recently used first) before a request waits for memory or a decoder is preempted.
In host memory the cache takes no KV pool room, and a hit is loaded over the host link before the
request's first prefill chunk. Overlap assumption: a load runs beside the instance's iterations
(copy engines work concurrently with compute) but is not overlapped with the request's own prefill
(no layer-by-layer pipelining), and concurrent loads share the link fairly.
"""
from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import deque
from functools import partial
from math import ceil, inf, nextafter
from typing import TYPE_CHECKING, Callable, Sequence

import simpy

from pddsim.engine import clock
from pddsim.engine.dp_balance import DpBalance
from pddsim.engine.job import Job
from pddsim.engine.multi_token import MultiToken
from pddsim.engine.network import Flow, Link
from pddsim.engine.perf import DecodeRun, chunk_attention_pairs
from pddsim.engine.prefix_cache import PrefixCache
from pddsim.engine.request import PREFILL, RECOMPUTE, Request
from pddsim.intmath import ceil_div

if TYPE_CHECKING:   # the engine reads a config's batching limits; it needs no config code
    from pddsim.config import Batching


class Segment:
    """What an instance computes between two iteration boundaries, while it is in flight: one
    iteration with prefill `chunks` in it (`k`, 0 or 1, of its iterations decode), or a `run` of
    k decode iterations priced in closed form, which a cut (new work) ends early, lowering `k` and
    `seconds`. It starts at `t0`; `ctx_end` is the decoders' KV when it ends.

    An instance refills one (`start`) for each segment: an object made per segment would cost the
    event loop an allocation at every iteration boundary (about 1% of its time)."""

    __slots__ = ("chunks", "run", "k", "seconds", "t0", "ctx_end", "cuttable", "seen_at",
                 "seen_iters")

    def __init__(self) -> None:
        self.start((), None, 0, 0.0, 0.0, 0)

    def start(self, chunks: Sequence[tuple[Job, int]], run: DecodeRun | None,
              k: int, seconds: float, t0: float, ctx_end: int) -> Segment:
        self.chunks = chunks
        self.run = run
        self.k = k
        self.seconds = seconds
        self.t0 = t0
        self.ctx_end = ctx_end
        self.cuttable = run is not None       # a decode run not cut yet: new work cuts it
        self.seen_at = -1.0                   # when `iters_done` last answered, and what
        self.seen_iters = 0
        return self

    def iters_done(self, now: float) -> int:
        """Iterations of the decode run that have ended by `now` (a binary search): the first
        iteration ending after now is the run's cut just above now, and all before it have
        ended (all k when even the last has). Routers ask many times at one instant."""
        if now == self.seen_at:
            return self.seen_iters
        run = self.run
        assert run is not None
        t = now - self.t0
        m = run.cut(nextafter(t, inf))
        if m < run.k or run.total_s > t:
            m -= 1
        self.seen_at, self.seen_iters = now, m
        return m


class Instance:
    # slots: with this many fields an instance's attributes would otherwise live in a plain dict
    # (past CPython's shared-key limit), and every access in the engine's loop would hash
    __slots__ = (
        "env", "name", "role", "_prefill_side", "cluster", "perf",
        "capacity", "block", "token_budget", "chunk", "pack_chunks", "max_batch", "coalesce",
        "cache", "host_load", "kv_bytes_per_token", "_cache_in_hbm", "_life", "busy_s",
        "prefill_first", "reserve", "reserve_share", "whole_prompts",
        "tokens_decoded", "preemptions", "kv_peak", "tracer", "load_watch", "_pending",
        # the engine's state (`_empty`)
        "_pinned", "_shared", "_loading", "_loads", "waiting", "prefilling", "held",
        "iters", "_ctx_base", "_finish_heap", "_decoders", "_joined", "_at_boundary", "_seq",
        "_seg_end", "_seg_max", "_segment", "_in_flight", "pending_prefill_tokens", "inbound_tokens",
        "waiting_tokens", "_wake", "_cut_event", "_promises", "_promised", "_stall_s",
        "_memory_short", "_spec", "most_tokens_per_iteration", "balance",
    )

    def __init__(self, env: simpy.Environment, name: str, role: str, cluster: str, *, perf,
                 prefill_side: bool, kv_capacity_tokens: int, batching: Batching,
                 cache: PrefixCache | None,
                 host_load: Link | None = None, kv_bytes_per_token: float = 0.0,
                 scheduler: str = "mixed", admission: str = "optimistic", reserve_share: float = 1.0,
                 tracer=None, multi_token: MultiToken | None = None,
                 balance: DpBalance | None = None):
        """`role`: the deployment's name for what it does (a label); `prefill_side`: it computes
        prompts (routers weigh its queued prefill tokens). `host_load` is None for a cache in
        HBM; for one in host memory, the link its hits are loaded over (`kv_bytes_per_token`
        sizes them). `scheduler` and `admission` are the engine's policies, `reserve_share` what
        reserve admission keeps of an output (catalog.EngineProfile). `tracer`: a timeline told
        of every segment, when one is kept. `multi_token`: its decoders verify several proposed
        tokens an iteration (None: one token). `balance`: its attention data-parallel ranks hold
        new prompts back until each has one (None: prompts join the next iteration)."""
        self.env = env
        self.name = name
        self.role = role
        self._prefill_side = prefill_side
        self.cluster = cluster
        self.perf = perf
        self.capacity = kv_capacity_tokens
        self.block = batching.kv_block_tokens
        assert batching.token_budget and batching.prefill_chunk and batching.max_batch, \
            "batching limits resolved under the engine (Batching.under)"
        self.token_budget = batching.token_budget
        self.chunk = batching.prefill_chunk
        self.pack_chunks = batching.chunk_packing != "alone"
        self.whole_prompts = batching.chunk_packing == "whole"
        self.prefill_first = scheduler == "prefill_first"
        self.reserve = admission == "reserve"
        self.reserve_share = reserve_share
        self.max_batch = batching.max_batch
        self.coalesce = batching.coalesce_decode
        self.cache = cache
        self.host_load = host_load
        self.kv_bytes_per_token = kv_bytes_per_token
        self._cache_in_hbm = cache is not None and host_load is None
        self._life = 0                        # crashes so far: a job submitted before one is gone
        self.busy_s = 0.0
        self.tokens_decoded = 0
        self.preemptions = 0
        self.kv_peak = 0                      # most KV tokens in use at an iteration boundary
        self.tracer = tracer
        self.load_watch: dict | None = None   # a pool's index: told when what routers see may change
        self._spec = multi_token
        self.balance = balance
        self.most_tokens_per_iteration = 1 if multi_token is None else multi_token.k + 1
        self._empty()
        self._pending: clock.Timer = clock.urgent(env, self._step)   # what the loop continues from

    def _empty(self) -> None:
        """The engine's state of an instance serving nothing (at start, and after a restart)."""
        self._pinned: dict[Job, int] = {}  # leading blocks of its chain each request pins
        self._shared = 0                      # pinned tokens admitted requests' KV also counts
        self._loading = 0                     # admitted requests whose hit is being loaded
        self._loads: dict[Job, Flow] = {}   # their loads in flight over the host link
        self.waiting: deque[Job] = deque()
        self.prefilling: list[Job] = []
        self.held = 0                         # KV tokens of admitted requests not decoding
        self.iters = 0                        # decode iterations run so far
        self._ctx_base = 0                    # sum(context_at_join - start_iter) over decoders
        self._finish_heap: list[tuple[int, int, Job]] = []
        self._decoders: dict[Job, None] = {}   # in join order: the newest is preempted first
        self._joined: list[Job] = []
        # (request, callback, leave)
        self._at_boundary: list[tuple[Job, Callable[[Job, int], None], bool]] = []
        self._seq = 0
        self._seg_end: list[int] = []         # suffix-max stack of iteration times, by end iter
        self._seg_max: list[float] = []
        self._segment = Segment()
        self._in_flight: Segment | None = None   # `_segment` while it is computed
        self.pending_prefill_tokens = 0
        self.inbound_tokens = 0               # prompts whose KV is on its way here (the pipeline's)
        self.waiting_tokens = 0
        self._wake: clock.Timer | None = None
        self._cut_event: clock.Timer | None = None   # a cut at a boundary that is now, pending
        self._promises: dict[Job, int] = {}   # `reserve`: each admitted request's whole length
        self._promised = 0                    # and their sum
        self._stall_s = 0.0                   # `prefill_first`: decoders paused since their last token
        self._memory_short = False            # the last admission stopped for want of KV memory
        if self._spec is not None:
            self._spec.reset()
        if self.balance is not None:
            self.balance.reset()

    def crash(self) -> None:
        """The instance dies: its loop stops where it is, and every request's KV on it, its
        prefix cache and its queue are lost (the pipeline has re-dispatched those requests): its
        jobs so far hold nothing here any more (`release`)."""
        self._life += 1
        for event in (self._pending, self._cut_event):
            if event is not None and event.callbacks is not None:     # not processed yet
                event.callbacks.clear()
        for flow in self._loads.values():
            assert self.host_load is not None
            self.host_load.cancel(flow)
        if self.cache is not None:
            self.cache.clear()
        self._empty()

    def restart(self) -> None:
        """Back in service after a crash, serving nothing, its cache empty."""
        self._pending = clock.urgent(self.env, self._step)

    # -- what routers see ---------------------------------------------------------------------
    @property
    def decode_context(self) -> int:
        """KV tokens of the decoders, counting the iterations already run in a decode run under
        way (a router must see the load that a one-iteration-at-a-time engine would show)."""
        seg = self._in_flight
        if seg is None or seg.run is None:
            return self._ctx_base + len(self._decoders) * self.iters
        if self._spec is not None:
            return (self._ctx_base + len(self._decoders) * self.iters
                    + self._spec.grown(self.iters, seg.iters_done(clock.now(self.env))))
        return self._ctx_base + len(self._decoders) * (self.iters + seg.iters_done(clock.now(self.env)))

    @property
    def kv_load(self) -> int:
        """KV tokens in use plus those already promised to waiting requests."""
        return self.held + self.decode_context + self.waiting_tokens

    @property
    def kv_load_floor(self) -> int:
        """`kv_load` without the iterations of the decode run under way: never above it until
        this instance's state next changes (a pool's index keys instances by it)."""
        return self.held + self._ctx_base + len(self._decoders) * self.iters + self.waiting_tokens

    @property
    def kv_load_ceiling(self) -> int:
        """`kv_load` once the decode run under way has run to its end: never below it (a router
        that can tell two instances apart by these bounds need not find where the runs are)."""
        seg = self._in_flight
        if seg is None or seg.run is None:
            return self.kv_load_floor
        return self.held + seg.ctx_end + self.waiting_tokens

    @property
    def kv_in_use(self) -> int:
        """KV tokens held now: admitted prompts and KV kept for transfers, plus every decoder's."""
        return self.held + self.decode_context

    @property
    def blocked_on_memory(self) -> bool:
        """Work waits because KV memory held it back at the last admission, not merely for the
        next iteration boundary (admission happens between iterations) or for a batch slot."""
        return bool(self.waiting) and self._memory_short

    @property
    def queued_tokens(self) -> int:
        """Work accepted but not done: prefill tokens still to compute on a prefill-side instance
        (net of the prefix hits they will get), tokens waiting for admission (memory) on a decoder,
        and the prompts whose KV is on its way to it over RDMA (it takes them when it lands)."""
        return self.pending_prefill_tokens if self._prefill_side \
            else self.waiting_tokens + self.inbound_tokens

    @property
    def kv_pool_used(self) -> int:
        """KV tokens taking room in the pool: requests' KV plus (an HBM cache) the cached blocks
        no admitted request counts already. Exact when several requests share a block: the
        cache counts it once and each request's share is taken off."""
        used = self.kv_in_use
        if self._cache_in_hbm:
            assert self.cache is not None
            used += self.cache.used_tokens - self._shared
        return used

    def _changed(self) -> None:
        """What routers see (queued work, KV load) may have changed: called before this instance
        calls out (a pipeline's hook may route) and before it waits, so a pool's index that reads
        it at the next pick misses nothing. In between, only a decode run's progress moves the KV
        load, and only up."""
        if self.load_watch is not None:
            self.load_watch[self] = None

    def cached_tokens(self, req: Request) -> int:
        if self.cache is None or not req.hash_ids:
            return 0
        return min(req.input_tokens, self.cache.match(req.hash_ids) * req.block_tokens)

    # -- what pipelines call --------------------------------------------------------------------
    def submit(self, job: Job, *, prefill: int, decode: int, context: int, ready: int = 0,
               use_cache: bool = False, hold: bool = False) -> None:
        """Queue work: compute `prefill` tokens over `context` resident ones, then decode `decode`
        tokens (the prefill's last chunk yields the first of them), or with `hold` keep the KV and
        call the job's `on_held`. `ready` tokens were computed elsewhere and reach the user when
        this instance admits the job. With `use_cache`, the prompt's cached prefix is
        looked up at admission and skipped."""
        job.inst = self
        job.life = self._life
        job.hold = hold
        job.prefill_left = prefill
        job.decode_left = decode
        job.context = context
        job.ready_tokens = ready
        job.needs_lookup = self.cache is not None and bool(job.hash_ids) and (
            use_cache or self._cache_in_hbm)
        job.uses_cache = use_cache
        job.decoding = False
        if job.queue_stage is not None:
            job.req.enter(job.queue_stage, clock.now(self.env))
        if use_cache:   # queued work counts net of the hit it will get; `_lookup_prefix` reconciles
            job.req.hit_tokens = self._hit_blocks(job) * job.block_tokens
            self.pending_prefill_tokens += prefill - job.req.hit_tokens
        else:
            self.pending_prefill_tokens += prefill
        self.waiting_tokens += prefill + context
        self.waiting.append(job)
        self._poke()

    def release(self, job: Job) -> None:
        """A job that holds its KV here (`hold`) no longer needs it: shipped, or its attempt
        abandoned. A job from before a crash holds nothing: the crash took its KV."""
        if job.life != self._life:
            return
        self.held -= job.reserved
        job.reserved = 0
        self._unpin(job)
        self._unpromise(job)
        self._poke()

    def _unpromise(self, job: Job) -> None:
        """`job`'s work here has let go of its KV: its reservation (`reserve`) ends."""
        if self._promises:
            self._promised -= self._promises.pop(job, 0)

    def withdraw(self, job: Job) -> bool:
        """Take back a request still waiting for admission here (the pipeline serves it
        elsewhere); False if it was admitted already."""
        if job.inst is not self or job not in self.waiting:
            return False
        self.waiting.remove(job)
        self.waiting_tokens -= job.prefill_left + job.context
        not_looked_up = job.needs_lookup and job.uses_cache   # its queued work is net of its hit
        self.pending_prefill_tokens -= job.prefill_left - (job.req.hit_tokens if not_looked_up else 0)
        self._unpin(job, admitted=False)
        job.inst = None
        self._changed()
        return True

    def add_inbound(self, tokens: int) -> None:
        """A prompt of `tokens` is on its way here over RDMA (negative: it landed)."""
        self.inbound_tokens += tokens
        self._changed()

    def keep_in_cache(self, req: Request) -> None:
        """The prompt's KV reached this instance: its cache keeps what fits (in HBM, in the room
        that reservations, running decoders and waiting requests' pins leave)."""
        if self.cache is None or not req.hash_ids:
            return
        self._insert(req, 0)

    def at_boundary(self, job: Job, then, *, leave: bool) -> None:
        """At the next iteration boundary call `then(job, tokens_made_here)`, with `leave` taking
        the decoder out of the batch first (a handoff). Nothing happens for a request that
        finishes first; one not admitted yet is served once it decodes."""
        self._at_boundary.append((job, then, leave))
        self._poke()

    # -- engine -----------------------------------------------------------------------------------
    def _poke(self) -> None:
        self._changed()
        wake = self._wake
        if wake is not None:                  # idle: wake the loop (once)
            self._wake = None
            clock.succeed(wake)
        else:
            seg = self._in_flight
            if seg is not None and seg.cuttable:   # a decode run: cut it at the next boundary
                seg.cuttable = False
                self._cut()

    def _step(self, _event: clock.Timer | None = None) -> None:
        """At an iteration boundary: serve what waits for one, admit, and start the next segment
        (or wait for work)."""
        env = self.env
        while True:
            if self._at_boundary:
                self._serve_boundary_calls()
            if self.waiting:
                self._admit()
            if not self.prefilling and not self._decoders:
                self._wake = self._pending = clock.event(env, self._step)   # a crash takes it back
                self._changed()               # `_poke` clears `_wake` as it triggers it
                return
            seg = self._plan()
            if seg is None:                   # out of memory: a decoder was preempted, re-plan
                continue
            self._in_flight = seg
            self._changed()
            self._pending = clock.timeout(env, seg.seconds, then=self._segment_done)
            return

    def _cut(self, urgent: clock.Timer | None = None) -> None:
        """New work arrived during a decode run: it ends at the first boundary from now on. A
        boundary after now is rescheduled at once; one that is now ends the run from an urgent
        event at this instant (`urgent`), never inside the caller."""
        seg = self._in_flight
        assert seg is not None and seg.run is not None
        run = seg.run
        done_s = clock.now(self.env) - seg.t0
        k = run.cut(done_s)
        elapsed = run.elapsed(k)
        if elapsed <= done_s and urgent is None:
            self._cut_event = clock.urgent(self.env, self._cut)
            return
        self._cut_event = None
        pending = self._pending.callbacks
        assert pending is not None, "a run in flight waits on its end"
        pending.remove(self._segment_done)
        seg.k, seg.seconds = k, elapsed
        if elapsed > done_s:
            self._changed()
            self._pending = clock.timeout(self.env, elapsed - done_s, then=self._segment_done)
        else:
            self._segment_done(urgent)

    def _segment_done(self, _event: clock.Timer | None) -> None:
        seg = self._in_flight
        assert seg is not None
        self._in_flight = None
        self._complete(seg)
        self._step()

    def _admit(self) -> None:
        now = clock.now(self.env)
        while self.waiting:
            job = self.waiting[0]
            if job.needs_lookup:
                self._lookup_prefix(job)
            need = ceil_div(job.context + job.prefill_left, self.block) * self.block
            whole = self._whole(job) if self.reserve else need
            running = len(self.prefilling) + len(self._decoders) + self._loading
            pinned = self._pool_share(job)    # in the pool already, as cached blocks
            if need > self.capacity or (self.reserve and whole > self.capacity):   # can never fit
                self._dequeue()
                self._unpin(job, admitted=False)
                self.pending_prefill_tokens -= job.prefill_left
                self._changed()
                job.on_failed(job, "context exceeds the instance's KV memory")
                continue
            want = need - pinned
            if self.reserve:    # room for its reservation and what admitted requests still add
                want = max(want, whole - pinned + self._promised - self._kv_settled())
            self._memory_short = running < self.max_batch and self._free_tokens(want) < want
            if running >= self.max_batch or self._memory_short:
                return
            self._dequeue()
            if self.reserve:
                self._promises[job] = whole
                self._promised += whole
            self._shared += pinned
            if job.ready_tokens:
                job.req.emit(now, job.ready_tokens)
                job.ready_tokens = 0
            if job.prefill_left:
                if job.streams and job.req.stage == job.queue_stage:   # from where it queued
                    job.req.enter(PREFILL, now)
                job.reserved = need
                self.held += need
                if self.host_load is not None and job.uses_cache and job.req.hit_tokens:
                    self._loading += 1
                    self._loads[job] = self.host_load.send(
                        job.req.hit_tokens * self.kv_bytes_per_token, partial(self._loaded, job))
                else:
                    self.prefilling.append(job)
            else:
                job.reserved = 0
                self._join_decoding(job)
                self._joined.append(job)

    def _whole(self, job: Job) -> int:
        """KV blocks (in tokens) reserve admission keeps for `job`: its context and prompt, and
        `reserve_share` of the output it has still to make (fields as of its admission)."""
        return self.block * ceil_div(job.context + job.prefill_left
                                     + ceil(self.reserve_share * job.decode_left), self.block)

    def _dequeue(self) -> Job:
        job = self.waiting.popleft()
        self.waiting_tokens -= job.prefill_left + job.context
        return job

    def _loaded(self, job: Job) -> None:
        """A host-tier hit is in HBM: the request's prefill can start."""
        self._loading -= 1
        del self._loads[job]
        self.prefilling.append(job)
        self._poke()

    def _hit_blocks(self, job: Job) -> int:
        """Whole cached blocks of the prompt a lookup now would skip (the last token is computed)."""
        if self.cache is None or not job.hash_ids or not job.block_tokens:
            return 0
        return min(self.cache.match(job.hash_ids), (job.input_tokens - 1) // job.block_tokens)

    def _lookup_prefix(self, job: Job) -> None:
        """At the head of the queue: pin the cached prefix the request will use. With
        `use_cache` that is its hit, skipped by the prefill (the cache may have changed since
        `submit` estimated it); otherwise (an HBM cache) the blocks of its own context that the
        cache also holds, so they are counted once."""
        job.needs_lookup = False
        if not job.uses_cache:
            assert self.cache is not None          # only an instance with a cache looks up
            self._pin(job, min(self.cache.match(job.hash_ids), job.context // job.block_tokens))
            return
        blocks = self._hit_blocks(job)
        self._pin(job, blocks)
        self.pending_prefill_tokens += job.req.hit_tokens - blocks * job.block_tokens
        job.req.hit_tokens = blocks * job.block_tokens
        job.prefill_left = job.input_tokens - job.req.hit_tokens
        job.context = job.req.hit_tokens

    def _pin(self, job: Job, blocks: int) -> None:
        """Pin the first `blocks` blocks of the request's chain (extending its pin)."""
        have = self._pinned.get(job, 0)
        if blocks > have:
            assert self.cache is not None
            self.cache.pin(job.hash_ids, blocks, have)
            self._pinned[job] = blocks

    def _pool_share(self, job: Job) -> int:
        """Tokens of the KV pool the request's pinned blocks take (none for a host-tier cache)."""
        return self._pinned.get(job, 0) * job.block_tokens if self._cache_in_hbm else 0

    def _unpin(self, job: Job, admitted: bool = True) -> None:
        if job in self._pinned:
            assert self.cache is not None
            if admitted:
                self._shared -= self._pool_share(job)
            self.cache.unpin(job.hash_ids, self._pinned.pop(job))

    def _insert(self, job: Job | Request, own_tokens: int) -> int:
        """Insert the request's chain into the cache; returns its blocks now resident. In HBM the
        cache may grow into the free pool plus `own_tokens` of the request's reservation that
        its blocks take over."""
        cache = self.cache
        assert cache is not None
        limit = None
        if self._cache_in_hbm:
            free = self.capacity - self.kv_pool_used - self._growth_left + own_tokens
            limit = max(cache.used_tokens, cache.used_tokens + free)
        return cache.insert(job.hash_ids, job.block_tokens, limit)

    @property
    def _growth_left(self) -> int:
        """KV the decoders still add before the segment in flight ends."""
        seg = self._in_flight
        return 0 if seg is None else max(0, seg.ctx_end - self.decode_context)

    def _kv_settled(self) -> int:
        """KV tokens requests hold between segments: admitted prompts and held KV, decoders'."""
        return self.held + self._ctx_base + len(self._decoders) * self.iters

    def _free_tokens(self, want: int) -> int:
        """KV tokens free in the pool, after evicting unused cached blocks (least recently used
        first) until `want` are free, if the cache is in HBM and that is needed. Asked between
        segments only: no iteration is in flight, so the decoders' KV is the settled one."""
        free = self.capacity - self._kv_settled()
        if self._cache_in_hbm:
            cache = self.cache
            assert cache is not None
            free -= cache.used_tokens - self._shared
            if free < want:
                free += cache.evict(want - free)
        return free

    def _plan(self) -> Segment | None:
        """Pick this segment's batch: one iteration with prefill in it, or decode iterations;
        None when a decoder had to be preempted first."""
        n = len(self._decoders)
        ctx = self._ctx_base + n * self.iters     # between segments: no run under way
        # a mixed iteration adds n tokens, cached blocks making room before a decoder; a
        # prefill-first engine runs waiting prompts alone while its decoders pause
        spec = self._spec
        verifying = n if spec is None else n * (spec.k + 1)   # tokens the decoders compute
        balance = self.balance
        holding = 0 if balance is None else balance.hold(n, len(self.prefilling), self.max_batch)
        if self.prefilling and not holding and (self.prefill_first or self.token_budget > verifying):
            decoding = n if not self.prefill_first else 0
            grows = n if spec is None else spec.grown(self.iters, 1)
            if decoding and self._free_tokens(grows) < grows:
                self._preempt_newest()
                return None
            tokens, kv_read = (n, ctx) if decoding else (0, 0)
            pairs = float(ctx) if decoding else 0.0      # a chunk's attention pairs are fractional
            if decoding and spec is not None:     # each decoder verifies k+1 tokens
                tokens, verified = spec.verify(n, ctx)
                pairs = float(verified)
            budget = self.token_budget - tokens
            chunks: list[tuple[Job, int]] = []
            decode_pairs, samples = pairs, tokens
            for job in self.prefilling:
                if budget <= 0 or (chunks and not self.pack_chunks):
                    break
                c = min(job.prefill_left, self.chunk, budget)
                if chunks and self.whole_prompts and c < job.prefill_left:
                    break                         # whole prompts only, but for the first
                chunks.append((job, c))
                budget -= c
                tokens += c
                pairs += chunk_attention_pairs(job.context, c)
                kv_read += job.context
            k = 0 if self.prefill_first else 1
            # the largest request's tokens: attention data parallelism keeps it on one rank
            largest = max([c for _, c in chunks]) if chunks else 1
            if spec is None:
                seconds = self.perf.iteration(tokens, pairs, kv_read, ctx if decoding else 0,
                                              decoding + len(chunks), None, largest)
                return self._segment.start(chunks, None, k, seconds, clock.now(self.env), ctx + k * n)
            seconds = (self.perf.iteration(tokens, pairs, kv_read, decode_pairs,
                                           decoding + len(chunks), samples + len(chunks),
                                           max(largest, spec.k + 1))
                       + (spec.draft_s(n, ctx) if decoding else 0.0))
            return self._segment.start(chunks, None, k, seconds, clock.now(self.env),
                                       ctx + spec.grown(self.iters, k))
        # decode only (n > 0): run until the next finish or until memory runs out
        heap = self._finish_heap
        while heap and (not heap[0][2].decoding or heap[0][2].inst is not self
                        or heap[0][0] != heap[0][2].finish_iter):
            heapq.heappop(heap)
        # one iteration when someone waits for a boundary or coalescing is off
        k = 1 if self._at_boundary or not self.coalesce else heap[0][0] - self.iters
        if holding:                               # decode only while the prompts are held
            k = min(k, holding)
        if spec is not None:                      # tokens per iteration as the decoders drew them
            srun = spec.run(n, ctx, self.iters, k, self._free_tokens(spec.grown(self.iters, k)))
            if srun is None:
                self._preempt_newest()
                return None
            return self._segment.start((), srun, srun.k, srun.total_s, clock.now(self.env),
                                       ctx + spec.grown(self.iters, srun.k))
        free = self._free_tokens(n * k)           # iterations the pool can grow, evicting if need be
        if free < n:
            self._preempt_newest()
            return None
        run = self.perf.decode_run(n, ctx, min(k, free // n))
        return self._segment.start((), run, run.k, run.total_s, clock.now(self.env), ctx + n * run.k)

    def _complete(self, seg: Segment) -> None:
        """Account a finished segment."""
        now = clock.now(self.env)
        chunks, k, elapsed = seg.chunks, seg.k, seg.seconds
        n = len(self._decoders)
        iters = self.iters
        made = k * n if self._spec is None else self._spec.grown(iters, k)   # decode tokens
        if self.tracer is not None:
            self.tracer.batch(self, seg.t0, now, made + sum(c for _, c in chunks), n + len(chunks), k)
        self.busy_s += elapsed
        if self.balance is not None:
            self.balance.ran(k, bool(chunks))
        if n and not k:                         # a prefill-only iteration: the decoders paused
            self._stall_s += elapsed
        elif n:
            self.tokens_decoded += made
            self._ctx_base += made - k * n      # `n * iters` counts one token an iteration
            self.iters = iters = iters + k
            used = self.held + self._ctx_base + n * iters   # settled
            if used > self.kv_peak:
                self.kv_peak = used
            # the gap before the segment's first token, and its longest
            run = seg.run
            first_s, longest_s = (elapsed, elapsed) if run is None else (run.first_s, run.longest(k))
            if self._stall_s:                   # the pause lengthens the gap before this token
                longest_s = max(longest_s, self._stall_s + first_s)
                self._stall_s = 0.0
            self._push_segment(longest_s)
            if self._joined:
                first = seg.t0 + first_s
                for job in self._joined:
                    if job.inst is self and job.decoding:   # not preempted before it ran
                        job.req.mark_stream_resumed(first)
                self._joined.clear()
        elif self._joined:
            self._joined.clear()
        if chunks:
            done = 0
            for job, c in chunks:
                job.prefill_left -= c
                job.context += c
                done += c
            self.pending_prefill_tokens -= done
            self.prefilling = [r for r in self.prefilling if r.prefill_left > 0]
            for job, _ in chunks:
                if job.prefill_left == 0:
                    self._prefill_done(job, now)
        heap = self._finish_heap
        while heap and heap[0][0] <= iters:     # `iters` changes only here
            job = heapq.heappop(heap)[2]
            if job.decoding and job.inst is self and job.finish_iter <= iters:
                self._leave_decoding(job)
                self._changed()
                job.on_finished(job)

    def _prefill_done(self, job: Job, now: float) -> None:
        if job.uses_cache and self.cache is not None and job.hash_ids:
            job.uses_cache = False
            if self._cache_in_hbm:            # its prompt's blocks become the cache's, pinned
                own = job.input_tokens // job.block_tokens   # whole blocks of its reservation
                have = self._pinned.get(job, 0)
                resident = min(own, self._insert(job, (own - have) * job.block_tokens))
                if resident > have:
                    self._pin(job, resident)
                    self._shared += (resident - have) * job.block_tokens
            else:                             # a copy goes to host memory
                self.cache.insert(job.hash_ids, job.block_tokens)
                self._unpin(job)
        if job.hold:
            self._changed()
            job.on_held(job)                  # KV stays held until `release` or `stream`
            return
        self.stream(job)

    def stream(self, job: Job) -> None:
        """The request's next token (made by its last prefill chunk) goes out now; then it
        decodes here. Called by the engine, or by a pipeline for work it held: from now on the
        work is this instance's own (a preempted decoder recomputes and streams again here)."""
        job.hold = False
        job.req.emit(clock.now(self.env))
        job.decode_left -= 1
        self.held -= job.reserved
        job.reserved = 0
        if job.decode_left <= 0:
            self._unpin(job)
            self._unpromise(job)
            self._changed()
            job.on_finished(job)
        else:
            self._join_decoding(job)
            self._changed()

    def _join_decoding(self, job: Job) -> None:
        if job.decode_stage is not None:
            job.req.enter(job.decode_stage, clock.now(self.env))
        job.decoding = True
        job.start_iter = self.iters
        job.finish_iter = self.iters + (job.decode_left if self._spec is None
                                        else self._spec.join(job, self.iters, job.decode_left))
        self._decoders[job] = None
        self._ctx_base += job.context - self.iters
        self._seq += 1
        heapq.heappush(self._finish_heap, (job.finish_iter, self._seq, job))

    def _leave_decoding(self, job: Job) -> int:
        """Settle the tokens a decoder made here since it joined; returns their number."""
        made = self.iters - job.start_iter if self._spec is None else self._spec.leave(job, self.iters)
        if made:
            i = bisect_right(self._seg_end, job.start_iter)
            job.req.emit_run(clock.now(self.env), made, self._seg_max[i])
        del self._decoders[job]
        self._unpin(job)
        self._unpromise(job)
        self._ctx_base -= job.context + made - self.iters
        job.context += made
        job.decode_left -= made
        job.decoding = False
        return made

    def _serve_boundary_calls(self) -> None:
        calls, self._at_boundary = self._at_boundary, []
        for job, then, leave in calls:
            if job.decoding and job.inst is self:
                made = self._leave_decoding(job) if leave else (
                    self.iters - job.start_iter if self._spec is None
                    else self._spec.made(job, self.iters))
                self._changed()
                then(job, made)
            elif job.inst is self:                # not admitted yet: wait for it to decode
                self._at_boundary.append((job, then, leave))

    def _push_segment(self, longest: float) -> None:
        """Keep, for every suffix of past iterations, its longest iteration (monotone stack)."""
        ends, maxes = self._seg_end, self._seg_max
        while maxes and maxes[-1] <= longest:
            maxes.pop()
            ends.pop()
        ends.append(self.iters)
        maxes.append(longest)

    def _preempt_newest(self) -> None:
        """Out of KV memory: the most recently joined decoder gives its blocks back and will
        recompute its whole context when readmitted (vLLM's recompute preemption)."""
        victim = next(reversed(self._decoders))
        self._leave_decoding(victim)
        victim.req.enter(RECOMPUTE, clock.now(self.env))
        self.preemptions += 1
        victim.prefill_left, victim.context = victim.context, 0
        self.pending_prefill_tokens += victim.prefill_left
        self.waiting_tokens += victim.prefill_left
        self.waiting.appendleft(victim)
        # a reserving engine that had to preempt reserves whole lengths from now on, for what it
        # has admitted too (SGLang raises its new-token ratio after a retraction): the victim waits
        # until there is room for all of it, so it does not preempt again and again
        if self.reserve and self.reserve_share < 1.0:
            self.reserve_share = 1.0
            self._promises = {r: self._whole(r) for r in self._promises}
            self._promised = sum(self._promises.values())
