"""Feeds a workload into a pipeline: open loop at (re)scheduled times, or closed loop, where a
request leaves only `think_s` after the request it follows has finished streaming, so a slow system
stretches the whole agent task as it would for a real agent.

Sessions start as recorded, as a Poisson process, or to keep a given number in flight. The time scale
is the load factor: sessions start that many times as often (recorded starts divided by it, a Poisson
start rate multiplied by it); open loop also plays each session that much faster, while closed loop
keeps a session's think times, which belong to the agent, not to the load.

A benchmark's workload brings its own load (`Workload.clients`): a pool of clients issuing its
requests in order, a warm-up phase first, the measured phase once the warm-up has drained.
"""
from __future__ import annotations

from collections import defaultdict
from functools import partial
from typing import Callable

import numpy as np

from pddsim.config import WorkloadConfig
from pddsim.engine import clock
from pddsim.errors import InputError
from pddsim.workload.model import Workload

_BLOCK = 4096          # scheduled times converted to Python floats at a time


class Replay:
    def __init__(self, env, workload: Workload, wcfg: WorkloadConfig, rng: np.random.Generator,
                 issue: Callable[[int], None]):
        self.env = env
        self.reqs = workload.requests
        self.n = len(self.reqs)               # (asked at every end: the table's length is a call)
        self.cfg = wcfg
        self.rng = rng
        self.issue_at_now = issue
        self.closed = wcfg.replay == "closed"
        self.clients = workload.clients
        self.issued = 0                       # benchmark: requests its clients have issued
        self.phase_end = 0                    # and the end of the phase they are issuing
        self.ended = 0
        self.all_ended = env.event()
        # sessions in order of first appearance; a request without a session is its own. Held as
        # arrays (members of session s: self.members[self.bounds[s]:self.bounds[s + 1]]), not a list
        # per session: a million independent requests are a million sessions.
        n = self.n
        ids = self.reqs.column("session_id")
        keys = np.where(ids >= 0, ids, -1 - np.arange(n, dtype=np.int64))
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        rank = np.empty(len(first), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        self.session_of = rank[inverse]
        self.members = np.argsort(self.session_of, kind="stable")
        counts = np.bincount(self.session_of, minlength=len(first))
        self.bounds = np.concatenate(([0], np.cumsum(counts)))
        self.n_sessions = len(first)
        self.left_in_session = counts.tolist()
        self.children: dict[int, list[int]] = defaultdict(list)
        if self.closed:
            follows = self.reqs.column("follows")
            for i in np.flatnonzero(follows >= 0).tolist():
                parent = int(follows[i])
                _check_follows(workload.source, i, parent, self.session_of,
                               wcfg.session_start == "concurrent")
                self.children[parent].append(i)
        self.next_session = 0

    def start(self) -> None:
        if not self.n:
            self.all_ended.succeed()
            return
        if self.clients is not None:
            self._start_phase(self.clients.warmup or self.n)
            return
        start = self.cfg.session_start
        if start == "concurrent":
            assert self.cfg.concurrent_sessions is not None     # the config requires it
            for _ in range(min(self.cfg.concurrent_sessions, self.n_sessions)):
                self._start_session(self.next_session)
            return
        ts = self.cfg.time_scale
        arrivals = self.reqs.column("arrival_s")
        firsts = arrivals[self.members[self.bounds[:-1]]]
        if start == "recorded":
            starts = firsts / ts
        else:
            assert self.cfg.session_rate_rps is not None        # the config requires it
            gaps = self.rng.exponential(1.0 / (self.cfg.session_rate_rps * ts), self.n_sessions)
            starts = np.concatenate(([0.0], np.cumsum(gaps[1:])))
        if self.closed:
            times = starts
            order = np.argsort(times, kind="stable")
            self._at_times(times[order], order, self._start_session)
            return
        # open loop: every request at its session's start plus its recorded offset
        times = starts[self.session_of] + (arrivals - firsts[self.session_of]) / ts
        order = np.argsort(times, kind="stable")
        self._at_times(times[order], order, self.issue_at_now)

    def _at_times(self, times: np.ndarray, items: np.ndarray, action: Callable[[int], None]) -> None:
        """Call `action(item)` at each item's time (`times` sorted, none before now), from event
        callbacks: one timeout per later time, the first at once. The times are read a block at a
        time: a million requests' times and items as Python lists would hold ~70 MB to the end."""
        env = self.env
        at: list[float] = []
        todo: list[int] = []
        read = i = 0                          # items read from the arrays; the next in the block

        def due(_event) -> None:
            nonlocal at, todo, read, i, times, items
            while True:
                if i == len(at):
                    if read == len(times):
                        break
                    at = times[read:read + _BLOCK].tolist()
                    todo = items[read:read + _BLOCK].tolist()
                    read += len(at)
                    i = 0
                if at[i] > clock.now(env):
                    clock.timeout(env, at[i] - clock.now(env), then=due)
                    return
                item = todo[i]
                i += 1
                action(item)
            # all issued; `due` refers to itself, so it and what it holds would live until a
            # garbage collection
            at, todo, times, items = [], [], times[:0], items[:0]
        clock.timeout(env, 0, then=due)

    def _start_session(self, s: int) -> None:
        self.next_session = max(self.next_session, s + 1)
        members = self.members[self.bounds[s]:self.bounds[s + 1]].tolist()
        arrivals, follows = self.reqs.arrival_s, self.reqs.follows
        base = arrivals[members[0]]
        if self.closed:
            roots, ts = [i for i in members if follows[i] < 0], 1.0
        else:
            roots, ts = members, self.cfg.time_scale
        offsets = np.array([(arrivals[i] - base) / ts for i in roots])
        order = np.argsort(offsets, kind="stable")
        self._at_times(clock.now(self.env) + offsets[order], np.array(roots)[order], self.issue_at_now)

    def _start_phase(self, end: int) -> None:
        """A benchmark phase begins: its clients start, evenly over the ramp, each issuing the
        next request in order until the phase's requests are all issued."""
        assert self.clients is not None
        self.phase_end = end
        count = min(self.clients.concurrency, end - self.issued)
        starts = clock.now(self.env) + np.arange(count) * (self.clients.ramp_s / count)
        self._at_times(starts, np.full(count, end, dtype=np.int64), self._client_next)

    def _client_next(self, phase_end: int, _event=None) -> None:
        """A client of the phase ending at `phase_end` is free: it issues the phase's next
        request, if one is left (a client of a finished phase issues nothing)."""
        if self.issued < phase_end == self.phase_end:
            self.issued += 1
            self.issue_at_now(self.issued - 1)

    def request_ended(self, idx: int) -> None:
        if self.clients is not None:
            self.ended += 1
            if self.ended == self.n:
                self.all_ended.succeed()
            elif self.ended == self.phase_end:        # the warm-up has drained
                self._start_phase(self.n)
            else:
                clock.timeout(self.env, self.clients.think_s,
                              then=partial(self._client_next, self.phase_end))
            return
        self.ended += 1
        for child in self.children.pop(idx, ()):
            clock.timeout(self.env, self.reqs.think_s[child], then=partial(self._issue, child))
        s = int(self.session_of[idx])
        self.left_in_session[s] -= 1
        if (self.left_in_session[s] == 0 and self.cfg.session_start == "concurrent"
                and self.next_session < self.n_sessions):
            self._start_session(self.next_session)
        if self.ended == self.n:
            self.all_ended.succeed()

    def _issue(self, idx: int, _think: clock.Timer) -> None:
        """A turn's think time is over: it is issued."""
        self.issue_at_now(idx)


def _check_follows(source: str, i: int, follows: int, session_of: np.ndarray,
                   sessions_wait: bool) -> None:
    """A turn follows an earlier request (no cycle of turns waiting for each other); with sessions
    started as others end, one of its own session: a session would otherwise wait forever for a
    turn of one that starts only after it has ended."""
    if follows >= i:
        raise InputError(f"{source}: request {i} follows request {follows}, not an earlier one")
    if sessions_wait and session_of[follows] != session_of[i]:
        raise InputError(f"{source}: request {i} follows request {follows} of another session; "
                         "with concurrent session starts a turn follows a turn of its own session")
