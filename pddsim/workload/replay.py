"""Feeds a workload into a pipeline: open loop at (re)scheduled times, or closed loop, where a
request leaves only `think_s` after the request it follows has finished streaming, so a slow system
stretches the whole agent task as it would for a real agent.

Sessions start as recorded, as a Poisson process, or to keep a given number in flight. The time scale
is the load factor: sessions start that many times as often (recorded starts divided by it, a Poisson
start rate multiplied by it); open loop also plays each session that much faster, while closed loop
keeps a session's think times, which belong to the agent, not to the load.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable

import numpy as np

from pddsim.config import WorkloadConfig
from pddsim.workload.model import Workload


class Replay:
    def __init__(self, env, workload: Workload, wcfg: WorkloadConfig, rng: np.random.Generator,
                 issue: Callable[[int], None]):
        self.env = env
        self.reqs = workload.requests
        self.cfg = wcfg
        self.rng = rng
        self.issue_at_now = issue
        self.closed = wcfg.replay == "closed"
        self.ended = 0
        self.all_ended = env.event()
        # sessions in order of first appearance; a request without a session is its own
        keys = [r.session_id if r.session_id >= 0 else -1 - i for i, r in enumerate(self.reqs)]
        members: dict[int, list[int]] = defaultdict(list)
        for i, k in enumerate(keys):
            members[k].append(i)
        self.sessions = list(members.values())
        self.session_of = np.empty(len(self.reqs), dtype=np.int64)
        for s, idxs in enumerate(self.sessions):
            self.session_of[idxs] = s
        self.left_in_session = [len(m) for m in self.sessions]
        self.children: dict[int, list[int]] = defaultdict(list)
        if self.closed:
            for i, r in enumerate(self.reqs):
                if r.follows >= 0:
                    self.children[r.follows].append(i)
        self.next_session = 0

    def start(self) -> None:
        if not self.reqs:
            self.all_ended.succeed()
            return
        start = self.cfg.session_start
        if start == "concurrent":
            assert self.cfg.concurrent_sessions is not None     # the config requires it
            for _ in range(min(self.cfg.concurrent_sessions, len(self.sessions))):
                self._start_session(self.next_session)
            return
        ts = self.cfg.time_scale
        firsts = np.array([self.reqs[m[0]].arrival_s for m in self.sessions], dtype=float)
        if start == "recorded":
            starts = firsts / ts
        else:
            assert self.cfg.session_rate_rps is not None        # the config requires it
            gaps = self.rng.exponential(1.0 / (self.cfg.session_rate_rps * ts), len(self.sessions))
            starts = np.concatenate(([0.0], np.cumsum(gaps[1:])))
        if self.closed:
            times = starts
            order = np.argsort(times, kind="stable")
            self.env.process(self._at_times(times[order], order, self._start_session))
            return
        # open loop: every request at its session's start plus its recorded offset
        arrivals = np.array([r.arrival_s for r in self.reqs], dtype=float)
        times = starts[self.session_of] + (arrivals - firsts[self.session_of]) / ts
        order = np.argsort(times, kind="stable")
        self.env.process(self._at_times(times[order], order, self.issue_at_now))

    def _at_times(self, times, items, action):
        env = self.env
        for t, item in zip(times.tolist(), items.tolist()):
            if t > env.now:
                yield env.timeout(t - env.now)
            action(item)

    def _start_session(self, s: int) -> None:
        self.next_session = max(self.next_session, s + 1)
        members = self.sessions[s]
        base = self.reqs[members[0]].arrival_s
        if self.closed:
            roots, ts = [i for i in members if self.reqs[i].follows < 0], 1.0
        else:
            roots, ts = members, self.cfg.time_scale
        offsets = np.array([(self.reqs[i].arrival_s - base) / ts for i in roots])
        order = np.argsort(offsets, kind="stable")
        self.env.process(self._at_times(self.env.now + offsets[order], np.array(roots)[order],
                                        self.issue_at_now))

    def request_ended(self, idx: int) -> None:
        self.ended += 1
        for child in self.children.pop(idx, ()):
            self.env.process(self._after(self.reqs[child].think_s, child))
        s = int(self.session_of[idx])
        self.left_in_session[s] -= 1
        if (self.left_in_session[s] == 0 and self.cfg.session_start == "concurrent"
                and self.next_session < len(self.sessions)):
            self._start_session(self.next_session)
        if self.ended == len(self.reqs):
            self.all_ended.succeed()

    def _after(self, delay: float, idx: int):
        yield self.env.timeout(delay)
        self.issue_at_now(idx)
