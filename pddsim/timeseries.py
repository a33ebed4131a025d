"""What a run looked like over time: instance and link state sampled at a fixed period, and
per-window latency figures computed from the request records afterwards.

The sampler only reads state, so a run's results are the same with it on or off; off, it costs
nothing (no process is started). Samples feed the utilisation figures a busy share alone hides:
KV memory occupancy (held for transfers as well as for running requests), time blocked on memory,
and how much of what the background load leaves of a link our transfers use.
"""
from __future__ import annotations

from array import array
from math import nan
from typing import Any, Callable

import numpy as np
import pandas as pd

from pddsim.engine.network import Link
from pddsim.workload.stats import BUCKETS

FULL = 0.99          # KV occupancy at or above this share counts as memory full
INSTANCE_METRICS = ("queue_depth", "kv_occupancy", "memory_blocked")
LINK_METRICS = ("throughput_Bps", "capacity_Bps", "utilization", "flows_in_flight")
INSTANCE_UTILIZATION = ("kv_occupancy_mean", "kv_occupancy_p99", "kv_full_share",
                        "memory_blocked_share", "queue_depth_mean")


class Sampler:
    """SimPy process reading every instance and link each `period_s` seconds. A sample is one row
    of every instance's then every link's metrics (`width` values): the utilisation figures are
    read off its columns, the long table (`frame`) is built only from them."""

    def __init__(self, env, instances: list, links: list, period_s: float, daemons,
                 timeline=None):
        self.env = env
        self.daemons = daemons
        self.timeline = timeline
        self.instances = instances
        self.held: Callable[[Any], bool] | None = None   # elastic pools: is it held now
        self.links = links
        self.period_s = period_s
        self.time_s = array("d")
        self.values = array("d")            # one row of `width` values per sample
        self.columns = [(inst.name, m) for inst in instances for m in INSTANCE_METRICS] + [
            (link.name, m) for link in links for m in LINK_METRICS]
        self.width = len(self.columns)
        self._column = {c: k for k, c in enumerate(self.columns)}
        self._carried = [0.0] * len(links)
        self._slept_at = 0.0                # when the tick being sampled was scheduled
        env.process(self._run())

    def _run(self):
        """Sample until only daemons are scheduled: a run that can make no more progress must
        still end, not tick on forever because of the sampler (see `engine/daemons.py`)."""
        while True:
            self._slept_at = self.env.now
            yield self.daemons.sleep(self.period_s)
            self.sample()
            if not self.daemons.keep_going():
                return

    def sample(self) -> None:
        t = self.env.now
        self.time_s.append(t)
        held = self.held
        if held is None:
            self.values.extend([x for inst in self.instances for x in (
                len(inst.waiting), inst.kv_in_use / inst.capacity, inst.blocked_on_memory)])
        else:                               # an instance not held has no figures (NaN)
            self.values.extend([x for inst in self.instances for x in (
                (len(inst.waiting), inst.kv_in_use / inst.capacity, inst.blocked_on_memory)
                if held(inst) else (nan, nan, nan))])
        for j, link in enumerate(self.links):
            if isinstance(link, Link) and link.background is not None:   # its tick due now
                link.background.catch_up(self._slept_at)                 # counts if it came first
            throughput = (link.bytes_carried - self._carried[j]) / self.period_s
            self._carried[j] = link.bytes_carried
            capacity = link.capacity_Bps
            self.values.extend((throughput, capacity,
                                throughput / capacity if capacity > 0 else 0.0,
                                link.flows_in_flight))
            if self.timeline is not None:
                self.timeline.link_counters(link, t)

    def _series(self, entity: str, metric: str) -> np.ndarray:
        """One entity's samples of one metric (a column of the samples)."""
        table = np.frombuffer(self.values, dtype=np.float64).reshape(-1, self.width)
        return table[:, self._column[(entity, metric)]]

    def frame(self) -> pd.DataFrame:
        """The samples in long form: one row per sample, entity and metric."""
        n = len(self.time_s)

        def tiled(labels: list[str]) -> pd.Categorical:
            one_row = pd.Categorical(labels)
            return pd.Categorical.from_codes(np.tile(one_row.codes, n), categories=one_row.categories)
        return pd.DataFrame({
            "time_s": np.repeat(np.frombuffer(self.time_s, dtype=np.float64), self.width),
            "entity": tiled([e for e, _ in self.columns]),
            "metric": tiled([m for _, m in self.columns]),
            "value": np.frombuffer(self.values, dtype=np.float64).copy()})

    def instance_utilization(self) -> pd.DataFrame:
        """Per instance: KV occupancy mean and P99, share of time at full memory, share of time
        its queue was blocked on memory, mean queue depth."""
        rows = {}
        for inst in self.instances:
            queue, kv, blocked = (self._series(inst.name, m) for m in INSTANCE_METRICS)
            if self.held is not None:       # the samples while it was held
                was_held = ~np.isnan(kv)
                queue, kv, blocked = queue[was_held], kv[was_held], blocked[was_held]
            if len(kv):
                rows[inst.name] = {"kv_occupancy_mean": kv.mean(),
                                   "kv_occupancy_p99": np.quantile(kv, 0.99),
                                   "kv_full_share": float((kv >= FULL).mean()),
                                   "memory_blocked_share": blocked.mean(),
                                   "queue_depth_mean": queue.mean()}
        return pd.DataFrame.from_dict(rows, orient="index", columns=list(INSTANCE_UTILIZATION))

    def link_utilization(self) -> dict[str, dict[str, float]]:
        """Per link: mean and P99 of the share of what background load leaves that our transfers
        used (by bytes of transfers completed in each window), mean flows in flight."""
        out = {}
        for link in self.links:
            share, flows = (self._series(link.name, m) for m in ("utilization", "flows_in_flight"))
            if len(share):
                out[link.name] = {"utilization_mean": float(share.mean()),
                                  "utilization_p99": float(np.quantile(share, 0.99)),
                                  "flows_in_flight_mean": float(flows.mean())}
        return out

    @staticmethod
    def empty_frame() -> pd.DataFrame:
        """The table of a run sampled never (sampling off)."""
        return pd.DataFrame({"time_s": np.empty(0), "entity": pd.Categorical([]),
                             "metric": pd.Categorical([]), "value": np.empty(0)})


def default_period_s(span_s: float) -> float:
    """About 200 samples over the trace's recorded span, at least one a second."""
    return max(1.0, span_s / 200.0)


def utilization_summary(instances: pd.DataFrame, links: dict) -> dict:
    """Summary keys per pool (role) and for the WAN; None where sampling was off."""
    out = {}
    for role, pool in instances.groupby("role", sort=True):
        for col in ("kv_occupancy_mean", "kv_occupancy_p99", "kv_full_share", "memory_blocked_share"):
            values = pool[col].dropna() if col in pool else pool.iloc[:0, 0]
            out[f"{col}_{role}"] = float(values.mean()) if len(values) else None
    wan = links.get("wan", {})
    out["wan_utilization_mean"] = wan.get("utilization_mean")
    out["wan_utilization_p99"] = wan.get("utilization_p99")
    return out


def window_table(requests: pd.DataFrame, period_s: float) -> pd.DataFrame:
    """Per window of arrival time and per hit-rate bucket (and `all`): arrivals, arrival rate,
    TTFT P50/P90 of completed requests, SLO attainment."""
    if not len(requests):
        return pd.DataFrame(columns=["window_start_s", "bucket", "arrivals", "arrival_rps",
                                     "ttft_p50_s", "ttft_p90_s", "slo_attainment"])
    # the `all` rows and the per-bucket rows grouped apart: no copy of every request per bucket
    df = pd.DataFrame({
        "window_start_s": np.floor(requests["arrival_s"].to_numpy() / period_s) * period_s,
        "bucket": requests["hit_bucket"],
        "ttft_done": requests["ttft_s"].where(requests["status"] == "completed"),
        "slo_met": requests["slo_met"]})

    def per(keys: list[str]) -> pd.DataFrame:
        g = df.groupby(keys, observed=True)
        return pd.DataFrame({
            "arrivals": g.size(),
            "ttft_p50_s": g["ttft_done"].median(),
            "ttft_p90_s": g["ttft_done"].quantile(0.9),
            "slo_attainment": g["slo_met"].mean(),
        }).reset_index()
    overall = per(["window_start_s"]).assign(bucket="all")
    buckets = per(["window_start_s", "bucket"])
    buckets["bucket"] = buckets["bucket"].astype(str)
    out = pd.concat([overall, buckets], ignore_index=True)
    out["arrival_rps"] = out["arrivals"] / period_s
    order = {b: i for i, b in enumerate(["all", *BUCKETS])}
    out = out.sort_values(["window_start_s", "bucket"], key=lambda s: s.map(order)
                          if s.name == "bucket" else s, kind="stable")
    return out[["window_start_s", "bucket", "arrivals", "arrival_rps", "ttft_p50_s", "ttft_p90_s",
                "slo_attainment"]].reset_index(drop=True)
