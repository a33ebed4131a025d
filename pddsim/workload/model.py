"""What a workload is once read: requests, each with its prefix-hash chain and session position.

Every reader and generator produces a `Workload`; the simulator consumes nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pddsim.engine.chain import BlockIds

# The latest simulated time (s) the clock, a float, resolves to a microsecond (~272 years): a
# workload replayed past it would have its latencies rounded away.
CLOCK_LIMIT_S = 2.0 ** 33


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request as the trace gives it.

    `hash_ids[i]` identifies the prefix up to block i (equal id => equal prefix); a block holds
    `block_tokens` tokens. `arrival_s` is the recorded (open-loop) arrival; replay keeps a
    session's requests at their offsets from its first one and may move the session's start
    (Poisson or concurrency-driven starts, a time scale). Closed-loop replay sends a request
    `think_s` after the request it `follows` (an index into the workload) has finished streaming; a
    request that follows none starts its session. Sub-agents are requests that follow a parent's
    request, so a session is a small dependency tree, not only a chain.
    """

    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: BlockIds = ()
    block_tokens: int = 512
    session_id: int = -1
    think_s: float = 0.0
    follows: int = -1


@dataclass(frozen=True, slots=True)
class Clients:
    """A fixed-concurrency benchmark's load: `concurrency` clients issue the requests in order,
    each its next one `think_s` after its previous one ended; the first `warmup` are a phase of
    their own (left out of the figures), the rest start once all of them have ended; each
    phase's clients start evenly over `ramp_s`."""

    concurrency: int
    warmup: int = 0
    ramp_s: float = 0.0
    think_s: float = 0.0


@dataclass(slots=True)
class Workload:
    """Requests sorted by arrival; a session's requests appear in their order within the session.
    A benchmark's requests carry no arrivals: its `clients` issue them."""

    requests: list[TraceRequest]
    source: str = "synthetic"
    sessions: int = 0
    extra: dict = field(default_factory=dict)
    clients: Clients | None = None

    @property
    def warmup(self) -> int:
        """Requests issued first and left out of the run's figures."""
        return self.clients.warmup if self.clients is not None else 0

    def __len__(self) -> int:
        return len(self.requests)
