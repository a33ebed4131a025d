"""Attention data-parallel prompt balancing, as TensorRT-LLM runs it with
`attention_dp_config.enable_balance`.

The attention ranks of a worker step together, and a rank computing a prompt holds back all the
others at the expert all-to-all, so the engine keeps new prompts out of the batch until every rank
has one to compute (then, while every rank also decodes, for up to `batching_wait` iterations more,
to gather more of them), or until its wait counter reaches `timeout`. The counter runs on every
iteration in which not every rank has a prompt, whether or not any prompt waits, and restarts at
`timeout`: a lone prompt joins at the counter's next turn, some 0 to `timeout` iterations later. A
worker with a rank that has nothing to decode takes its prompts at once.

The instance prices its ranks together (it does not place requests on ranks): every rank is taken
to decode while the worker has at least one decoder per rank, and to have a prompt while at least
one waits per rank.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pddsim.catalog import EngineProfile


class DpBalance:
    """The balancing state of one attention data-parallel worker of `ranks` ranks."""

    __slots__ = ("ranks", "timeout", "batching_wait", "waited", "batched", "_asked")

    def __init__(self, ranks: int, timeout: int, batching_wait: int):
        self.ranks, self.timeout, self.batching_wait = ranks, timeout, batching_wait
        self.reset()

    @classmethod
    def under(cls, engine: EngineProfile, ranks: int) -> DpBalance | None:
        """The balancing `engine` runs on a worker of `ranks` attention ranks (None: none)."""
        if ranks > 1 and engine.dp_balance_timeout_iters:
            return cls(ranks, engine.dp_balance_timeout_iters, engine.dp_balance_wait_iters)
        return None

    def reset(self) -> None:
        """Nothing counted yet (a worker starting or restarting)."""
        self.waited = 0       # iterations since the counter last turned
        self.batched = 0      # iterations prompts on every rank have been held to gather more
        self._asked = (False, False)

    def hold(self, decoders: int, prompts: int, max_batch: int) -> int:
        """Iterations from this boundary for which the waiting `prompts` stay out of the batch
        (0: they join this one). `ran` must follow with the iterations the segment ran."""
        every_rank_decodes = decoders >= self.ranks
        gathered = prompts >= self.ranks and decoders < max_batch
        if gathered:
            held = 1 if every_rank_decodes and self.batched < self.batching_wait else 0
        elif not every_rank_decodes or not prompts:
            held = 0
        else:
            held = max(0, self.timeout - 1 - self.waited)
        self._asked = (gathered, every_rank_decodes)
        return held

    def ran(self, iterations: int, prompts_joined: bool) -> None:
        """Count `iterations` run from the last boundary `hold` was asked at; `prompts_joined`:
        the segment took prompts in."""
        gathered, every_rank_decodes = self._asked
        if gathered:
            self.waited = 0
            if every_rank_decodes:
                self.batched = 0 if prompts_joined else self.batched + 1
        elif not every_rank_decodes or prompts_joined:
            self.waited = 0
        else:
            self.waited = (self.waited + iterations) % self.timeout
