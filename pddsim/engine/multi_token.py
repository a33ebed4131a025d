"""Multi-token decoding (MTP heads or a draft model, speculative decoding) on one instance.

Each decode iteration a request verifies `k` proposed tokens: the target model computes k+1 query
tokens for it in one pass (its last token and the k proposals), keeps the proposals up to the first
one it rejects and adds its own token at that position, so the request makes 1 to k+1 tokens an
iteration. Proposal j is accepted with `acceptance[j]` given that those before it were (a
per-position acceptance model), drawn from the instance's own seeded stream: turning multi-token
decoding on shifts no other random draw. Proposing costs `draft_cost` of a one-token decode
iteration of the batch per proposed token (the draft passes run one after another).

A request's tokens per iteration are drawn when it joins the batch, for the rest of its output
(the last iteration keeps only what is left: nothing is emitted past the output). So the
iteration at which it finishes is known at its join as in plain decode, and a run of iterations
keeps a closed form: the batch's KV grows by what its members accept, known iteration by
iteration, and each iteration is priced at its own context (an array, in one vectorised call).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pddsim.engine.perf import TabulatedRun

if TYPE_CHECKING:
    from pddsim.config import SpecDecode
    from pddsim.engine.job import Job


class MultiToken:
    """The tokens each decoder of an instance makes per iteration, and what iterations cost."""

    __slots__ = ("k", "accept", "draft_cost", "perf", "rng", "_steps", "_growth", "_base")

    def __init__(self, spec: SpecDecode, perf, rng: np.random.Generator):
        self.k = spec.k
        self.accept = np.asarray(spec.acceptance, dtype=float)
        self.draft_cost = spec.draft_cost
        self.perf = perf
        self.rng = rng
        self.reset()

    def reset(self) -> None:
        """No decoder (at start, and after a crash)."""
        self._steps: dict[Job, tuple[int, np.ndarray]] = {}   # its first iteration, tokens made
                                                              # after each of its iterations (from 0)
        self._growth = np.zeros(64, dtype=np.int64)   # tokens the batch adds at iteration _base + i
        self._base = 0

    # -- who makes how many tokens ------------------------------------------------------------------
    def join(self, job: Job, it: int, tokens: int) -> int:
        """`job` decodes from iteration `it` until it has made `tokens`: draw its tokens per
        iteration; returns how many iterations it takes."""
        if tokens <= 0:
            self._steps[job] = (it, np.zeros(1, dtype=np.int64))
            return 0
        accepted = np.cumprod(self.rng.random((tokens, self.k)) < self.accept, axis=1).sum(axis=1)
        made = np.cumsum(accepted + 1)
        steps = int(np.searchsorted(made, tokens)) + 1    # the first iteration reaching `tokens`
        made = np.concatenate(([0], made[:steps]))
        made[-1] = tokens
        self._steps[job] = (it, made)
        self._add(it, np.diff(made))
        return steps

    def made(self, job: Job, it: int) -> int:
        """Tokens `job` has made by iteration `it`."""
        start, made = self._steps[job]
        return int(made[min(it - start, len(made) - 1)])

    def leave(self, job: Job, it: int) -> int:
        """`job` leaves the batch at iteration `it`: returns the tokens it made; it adds none after."""
        start, made = self._steps.pop(job)
        done = min(it - start, len(made) - 1)
        self._add(it, -np.diff(made[done:]))
        return int(made[done])

    def _add(self, it: int, per_iteration: np.ndarray) -> None:
        if it - self._base > len(self._growth) // 2:          # forget iterations gone by
            self._growth = self._growth[it - self._base:].copy()
            self._base = it
        i = it - self._base
        end = i + len(per_iteration)
        if end > len(self._growth):
            self._growth = np.concatenate((self._growth, np.zeros(max(end, 2 * len(self._growth))
                                                                   - len(self._growth), np.int64)))
        self._growth[i:end] += per_iteration

    def grown(self, it: int, k: int) -> int:
        """Tokens the batch makes in iterations [it, it + k)."""
        i = it - self._base
        return int(self._growth[i:i + k].sum())

    # -- what iterations cost -----------------------------------------------------------------------
    def verify(self, n: int, context):
        """(query tokens, attention pairs) of n requests, holding `context` KV tokens in all, each
        verifying k+1 tokens: the j-th of them attends to its context and the j before it."""
        q = self.k + 1
        return n * q, q * context + n * q * (q - 1) / 2

    def draft_s(self, n: int, context):
        """Seconds of proposing k tokens for n requests holding `context` KV tokens (scalars or
        arrays): k passes, each `draft_cost` of the batch's one-token decode iteration."""
        if not self.draft_cost:
            return 0.0
        one = self.perf.iterations(n, context, context, context, n)
        return self.draft_cost * self.k * (one if np.ndim(context) else float(one))

    def run(self, n: int, context: int, it: int, k: int, free: int) -> TabulatedRun | None:
        """Up to k decode iterations of the n decoders from iteration `it`, holding `context` KV
        tokens at the first, stopping before the batch's KV outgrows `free` tokens (None when even
        the first would)."""
        i = it - self._base
        grown = np.cumsum(self._growth[i:i + k])
        m = int(np.searchsorted(grown, free, side="right"))
        if m == 0:
            return None
        ctx = context + np.concatenate(([0], grown[:m - 1])).astype(float)
        tokens, pairs = self.verify(n, ctx)
        times = self.perf.iterations(tokens, pairs, ctx, pairs, n, tokens) + self.draft_s(n, ctx)
        return TabulatedRun(times)
