"""A request in flight: what its trace entry asks, where it is, and its token stream so far.

The stream is kept as three numbers (first token, last token, largest gap) plus a count, never as a
per-token log. Finished requests leave only their record behind.

Where its time goes is kept as a partition: the request is always in exactly one named *stage* of
the path its stream takes, and entering a stage closes the previous one. The stages'
durations therefore add up to its end-to-end latency, and those closed before the first token to its
TTFT, by construction. Work off the stream's path (PDD's WAN copy while the RLD streams) is not a
stage: it delays nobody the user sees.

The stages are the system layer's vocabulary, its paths' (system/stages.py names them with
`name_stages`); the engine moves a request only into those its job names (where it queues, where
it decodes) and into two of its own, `PREFILL` and `RECOMPUTE`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from pddsim.engine.chain import BlockIds
    from pddsim.engine.job import Job


PREFILL = "prefill"          # its prompt is computed (its job admitted from where it queued)
RECOMPUTE = "recompute"      # preempted for memory: re-queued, recomputing its context
STAGE_INDEX: dict[str, int] = {}   # each stage's place in a request's `stages` (`name_stages`)
NO_TIME: list[float] = []         # a zero per stage


def name_stages(stages: Sequence[str]) -> None:
    """The stages a request's path can take, in the order its `stages` (and outputs) list them.
    Kept in place: what imported `STAGE_INDEX` or `NO_TIME` sees them."""
    assert PREFILL in stages and RECOMPUTE in stages, "the engine's own stages are among them"
    STAGE_INDEX.clear()
    STAGE_INDEX.update((name, i) for i, name in enumerate(stages))
    NO_TIME[:] = [0.0] * len(stages)


class Request:
    __slots__ = (
        "idx", "arrival_s", "input_tokens", "output_tokens", "hash_ids", "block_tokens",
        # outcome
        "hit_tokens", "hit_tokens_decode", "first_token_s", "last_token_s", "max_gap_s", "tokens_out",
        "finish_s", "failed", "pipeline", "wan_bytes", "wan_bytes_no_drc", "rdma_bytes",
        "handoffs", "handoff_stall_s", "handoff_tail_tokens", "relay_tokens",
        # the job of the instance serving its stream (engine/job.py)
        "job",
        # where its time went: current stage, since when, seconds per closed stage, the same
        # frozen at the first token; `log` keeps every (stage, entered_s) for a timeline, or None
        "stage", "stage_s", "stages", "ttft_stages", "log",
        # re-dispatches after faults so far
        "retries",
    )

    def __init__(self, idx: int, input_tokens: int, output_tokens: int, hash_ids: BlockIds,
                 block_tokens: int, arrival_s: float, stage: str, log: bool = False):
        """Request `idx` of the workload, its trace entry's lengths and chain given; `stage`:
        where it is as it arrives."""
        self.idx = idx
        self.arrival_s = arrival_s
        self.input_tokens = input_tokens
        self.output_tokens = max(1, output_tokens)
        self.hash_ids = hash_ids
        self.block_tokens = block_tokens
        self.hit_tokens = 0
        self.hit_tokens_decode = 0
        self.first_token_s: float | None = None
        self.last_token_s = 0.0               # read only once first_token_s is set
        self.max_gap_s = 0.0
        self.tokens_out = 0
        self.finish_s: float | None = None
        self.failed: str | None = None
        self.pipeline = ""                    # its route, once the system has decided it
        self.wan_bytes = 0.0
        self.wan_bytes_no_drc = 0.0
        self.rdma_bytes = 0.0
        self.handoffs = 0
        self.handoff_stall_s = 0.0
        self.handoff_tail_tokens = 0
        self.relay_tokens = 0
        self.job: Job | None = None
        self.stage = stage
        self.stage_s = arrival_s
        self.stages = NO_TIME[:]              # seconds per named stage, in order
        self.ttft_stages: list[float] | None = None
        self.log = [(stage, arrival_s)] if log else None
        self.retries = 0

    def retried(self, now: float, stage: str) -> Request:
        """The request sent again from scratch at `now`, in `stage`, after a fault lost its
        attempt (its KV is gone: everything is recomputed, and the stream starts over). It keeps
        its arrival, the time its stages took so far (the lost attempt's time stays in its
        stages), and the bytes it moved."""
        again = Request(self.idx, self.input_tokens, self.output_tokens, self.hash_ids,
                        self.block_tokens, self.arrival_s, stage)
        again.stages = self.stages[:]
        again.stages[STAGE_INDEX[self.stage]] += now - self.stage_s
        again.stage_s = now
        if self.log is not None:
            again.log = self.log + [(stage, now)]
        again.retries = self.retries + 1
        again.wan_bytes, again.wan_bytes_no_drc = self.wan_bytes, self.wan_bytes_no_drc
        again.rdma_bytes = self.rdma_bytes
        return again

    def enter(self, stage: str, now: float) -> None:
        """The stream's path moves on to `stage` at `now`."""
        if stage == self.stage:
            return
        self.stages[STAGE_INDEX[self.stage]] += now - self.stage_s
        self.stage, self.stage_s = stage, now
        if self.log is not None:
            self.log.append((stage, now))

    def close_stages(self, now: float) -> None:
        """The request has ended: account its last stage."""
        self.stages[STAGE_INDEX[self.stage]] += now - self.stage_s
        self.stage_s = now
        if self.log is not None:
            self.log.append(("", now))

    def _first_token(self, now: float) -> None:
        self.first_token_s = now
        frozen = self.stages[:]
        frozen[STAGE_INDEX[self.stage]] += now - self.stage_s
        self.ttft_stages = frozen

    def emit(self, now: float, n: int = 1) -> None:
        """`n` tokens reach the user at `now`."""
        if self.first_token_s is None:
            self._first_token(now)
        elif now - self.last_token_s > self.max_gap_s:
            self.max_gap_s = now - self.last_token_s
        self.last_token_s = now
        self.tokens_out += n

    def emit_run(self, now: float, n: int, longest_gap: float) -> None:
        """`n` tokens were produced one per iteration, the last at `now`; no gap between them
        exceeded `longest_gap` (the gap before the first is accounted by `mark_stream_resumed`)."""
        if longest_gap > self.max_gap_s:
            self.max_gap_s = longest_gap
        self.last_token_s = now
        self.tokens_out += n

    def mark_stream_resumed(self, now: float) -> None:
        """The first token of a decode run arrives at `now`: account the gap before it."""
        if self.first_token_s is None:
            self._first_token(now)
        elif now - self.last_token_s > self.max_gap_s:
            self.max_gap_s = now - self.last_token_s
