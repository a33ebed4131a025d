"""A unit of work on one instance, apart from the user's request it serves.

A request's life crosses several instances (a prefill, then a decoder; under PDD an RLD and an MD,
which may also absorb handed-over tokens while the RLD streams). Each piece of that is a `Job`: what
the engine computes for it (`prefill_left` tokens over `context` resident ones, then `decode_left`
tokens), what it holds there, and what comes next, as continuations the pipeline gives it:

* `on_held(job)`: a job with `hold` has computed its tokens and keeps their KV on the instance until
  the pipeline releases it (a prefill whose KV is shipped) or streams from it;
* `on_finished(job)`: its last token is out;
* `on_failed(job, reason)`: the instance cannot serve it.

A job is on one instance at a time; one that has let go of its instance may be submitted to another
(PD's prefill job, its KV landed, decodes on the decode instance).

A job `streams` when its instance's tokens reach the user: it is then its request's current job
(`Request.job`) and the engine moves the request's stages and token stream. A job that does not
stream (a catch-up part absorbed on an MD) touches nothing of its request.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from pddsim.engine.instance import Instance
    from pddsim.engine.request import Request


def _never(job: Job) -> None:
    raise AssertionError(f"request {job.req.idx}: its job has no such continuation")


class Job:
    __slots__ = (
        "req", "hash_ids", "block_tokens", "input_tokens", "streams", "queue_stage", "decode_stage",
        "on_held", "on_finished", "on_failed",
        # the engine's state of the job on its instance
        "prefill_left", "context", "decode_left", "ready_tokens", "start_iter", "finish_iter",
        "reserved", "needs_lookup", "uses_cache", "hold", "inst", "life", "decoding",
    )

    def __init__(self, req: Request, on_failed: Callable[[Job, str], None],
                 on_finished: Callable[[Job], None] = _never, queue_stage: str | None = None,
                 decode_stage: str | None = None, on_held: Callable[[Job], None] = _never,
                 streams: bool = True):
        """`queue_stage`: the stage its request enters while the job waits for admission,
        `decode_stage` the one it enters while the job decodes (None: it stays where it is; a
        job that does not stream names neither). Pipelines make one per request positionally:
        a class called with keywords gathers them into a dict first."""
        assert streams or queue_stage is decode_stage is None, "only a streaming job moves stages"
        self.req = req
        self.hash_ids = req.hash_ids
        self.block_tokens = req.block_tokens
        self.input_tokens = req.input_tokens
        self.streams = streams
        self.queue_stage = queue_stage
        self.decode_stage = decode_stage
        self.on_held = on_held
        self.on_finished = on_finished
        self.on_failed = on_failed
        self.prefill_left = 0
        self.context = 0
        self.decode_left = 0
        self.ready_tokens = 0
        self.start_iter = 0
        self.finish_iter = 0
        self.reserved = 0                     # KV tokens it holds, not decoding
        self.needs_lookup = False
        self.uses_cache = False
        self.hold = False
        self.inst: Instance | None = None     # where it is queued or runs; None once it is over
        self.life = 0                         # which life of `inst` (its crashes so far) it is in
        self.decoding = False
        if streams:
            req.job = self
