"""A run as a Perfetto / Chrome timeline, in the Trace Event Format (JSON).

A process per cluster with a track per instance, whose batches are complete slices (args: tokens
computed, batch size, iterations); a `network` process whose tracks are the links, each transfer an
async slice; a `requests` process where every request is an async track of its stages (the same
stages the latency breakdown adds up). Counters: each instance's KV occupancy and queue depth at
the end of each batch, each link's capacity left by background load and flows in flight, sampled.
Timestamps are microseconds of simulated time. Past `limit` events (track names aside) nothing more is
kept; the number left out and the simulated time of the first one are written in the file's
metadata, and `shortfall` says it in a sentence for the command line to print.
"""
from __future__ import annotations

import json
from pathlib import Path

US = 1e6


class Timeline:
    def __init__(self, limit: int):
        self.limit = limit
        self.events: list[dict] = []
        self.dropped = 0
        self.first_dropped_s: float | None = None     # simulated time of the first event left out
        self._kept = 0                    # events counted against the limit (not track names)
        self._pids: dict[str, int] = {}
        self._tids: dict[tuple[int, str], int] = {}
        self._flow_ids = 0

    # -- tracks ------------------------------------------------------------------------------
    def _pid(self, process: str) -> int:
        pid = self._pids.get(process)
        if pid is None:
            pid = self._pids[process] = len(self._pids) + 1
            self.events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                                "args": {"name": process}})
        return pid

    def _track(self, process: str, thread: str) -> tuple[int, int]:
        pid = self._pid(process)
        tid = self._tids.get((pid, thread))
        if tid is None:
            tid = self._tids[(pid, thread)] = len(self._tids) + 1
            self.events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                                "args": {"name": thread}})
        return pid, tid

    def _add(self, *events: dict) -> None:
        if self._kept + len(events) > self.limit:
            if not self.dropped:
                self.first_dropped_s = events[0]["ts"] / US
            self.dropped += len(events)
            return
        self._kept += len(events)
        self.events.extend(events)

    # -- what the engine and the pipelines report -----------------------------------------------
    def batch(self, inst, t0: float, t1: float, tokens: int, batch: int, iterations: int) -> None:
        pid, tid = self._track(f"cluster {inst.cluster}", inst.name)
        kind = "prefill+decode" if tokens > batch * iterations else "decode"
        self._add({"ph": "X", "name": kind, "cat": "batch", "pid": pid, "tid": tid,
                   "ts": t0 * US, "dur": (t1 - t0) * US,
                   "args": {"tokens": tokens, "batch": batch, "iterations": iterations}},
                  {"ph": "C", "name": f"{inst.name} kv_occupancy", "pid": pid, "ts": t1 * US,
                   "args": {"share": inst.kv_in_use / inst.capacity}},
                  {"ph": "C", "name": f"{inst.name} queue_depth", "pid": pid, "ts": t1 * US,
                   "args": {"requests": len(inst.waiting)}})

    def transfer(self, link, t0: float, t1: float, nbytes: float, request: int, what: str) -> None:
        pid, tid = self._track("network", link.name)
        self._flow_ids += 1
        common = {"cat": "transfer", "name": what, "pid": pid, "tid": tid,
                  "id": f"{link.name}:{self._flow_ids}"}
        self._add({**common, "ph": "b", "ts": t0 * US,
                   "args": {"bytes": nbytes, "request": request}},
                  {**common, "ph": "e", "ts": t1 * US})

    def link_counters(self, link, t: float) -> None:
        pid, _ = self._track("network", link.name)
        self._add({"ph": "C", "name": f"{link.name} capacity_Gbps", "pid": pid, "ts": t * US,
                   "args": {"Gbps": link.capacity_Bps * 8 / 1e9}},
                  {"ph": "C", "name": f"{link.name} flows_in_flight", "pid": pid, "ts": t * US,
                   "args": {"flows": link.flows_in_flight}})

    def request(self, req) -> None:
        """A request's stages, from its log of (stage, entered_s), closed at its end."""
        pid, tid = self._track("requests", "stages")
        marks = req.log
        events = []
        for (stage, t0), (_next, t1) in zip(marks, marks[1:]):
            common = {"cat": "request", "name": stage, "pid": pid, "tid": tid,
                      "id": f"r{req.idx}"}
            events.append({**common, "ph": "b", "ts": t0 * US,
                           "args": {"request": req.idx, "pipeline": req.pipeline}})
            events.append({**common, "ph": "e", "ts": t1 * US})
        self._add(*events)

    # -- output ---------------------------------------------------------------------------------
    def document(self) -> dict:
        return {"traceEvents": self.events, "displayTimeUnit": "ms",
                "otherData": {"generator": "pddsim", "events_dropped": self.dropped,
                              "first_dropped_s": self.first_dropped_s, "limit": self.limit}}

    def shortfall(self, end_s: float) -> str | None:
        """What the file lacks, in one sentence (None: nothing was left out)."""
        if not self.dropped:
            return None
        return (f"{self.dropped:,} events past the limit of {self.limit:,} left out: it covers "
                f"{self.first_dropped_s:,.0f} s of the run's {end_s:,.0f} s (--timeline-limit "
                "keeps more)")

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.document()))
