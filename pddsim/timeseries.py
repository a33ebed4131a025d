"""What a run looked like over time: instance and link state sampled at a fixed period, and
per-window latency figures computed from the request records afterwards.

The sampler only reads state, so a run's results are the same with it on or off; off, it costs
nothing (no process is started). Samples feed the utilisation figures a busy share alone hides:
KV memory occupancy (held for transfers as well as for running requests), time blocked on memory,
and how much of what the background load leaves of a link our transfers use.
"""
from __future__ import annotations

from array import array
from itertools import repeat

import numpy as np
import pandas as pd

from pddsim.workload.stats import BUCKETS

FULL = 0.99          # KV occupancy at or above this share counts as memory full
INSTANCE_METRICS = ("queue_depth", "kv_occupancy", "memory_blocked")


class Sampler:
    """SimPy process reading every instance and link each `period_s` seconds."""

    def __init__(self, env, instances: list, links: list, period_s: float, daemons,
                 timeline=None):
        self.env = env
        self.daemons = daemons
        self.timeline = timeline
        self.instances = instances
        self.links = links
        self.period_s = period_s
        self.time_s = array("d")
        self.entity: list[str] = []      # interned names, one per row
        self.metric: list[str] = []
        self.value = array("d")
        self._carried = {link.name: 0.0 for link in links}
        self._instance_entities = [inst.name for inst in instances for _ in INSTANCE_METRICS]
        self._instance_metrics = list(INSTANCE_METRICS) * len(instances)
        env.process(self._run())

    def _row(self, t: float, entity: str, metric: str, value: float) -> None:
        self.time_s.append(t)
        self.entity.append(entity)
        self.metric.append(metric)
        self.value.append(value)

    def _run(self):
        """Sample until only daemons are scheduled: a run that can make no more progress must
        still end, not tick on forever because of the sampler (see `engine/daemons.py`)."""
        while True:
            yield self.daemons.sleep(self.period_s)
            self.sample()
            if not self.daemons.keep_going():
                return

    def sample(self) -> None:
        t = self.env.now
        # three rows per instance, in bulk: a large fleet samples thousands of instances
        self.time_s.extend(repeat(t, len(self._instance_entities)))
        self.entity.extend(self._instance_entities)
        self.metric.extend(self._instance_metrics)
        self.value.extend([x for inst in self.instances for x in (
            len(inst.waiting), inst.kv_in_use / inst.capacity, inst.blocked_on_memory)])
        for link in self.links:
            carried = link.bytes_carried - self._carried[link.name]
            self._carried[link.name] = link.bytes_carried
            throughput = carried / self.period_s
            self._row(t, link.name, "throughput_Bps", throughput)
            self._row(t, link.name, "capacity_Bps", link.capacity_Bps)
            self._row(t, link.name, "utilization", throughput / link.capacity_Bps
                      if link.capacity_Bps > 0 else 0.0)
            self._row(t, link.name, "flows_in_flight", link.flows_in_flight)
            if self.timeline is not None:
                self.timeline.link_counters(link, t)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({
            "time_s": np.frombuffer(self.time_s, dtype=np.float64),
            "entity": pd.Categorical(self.entity),
            "metric": pd.Categorical(self.metric),
            "value": np.frombuffer(self.value, dtype=np.float64)})

    @staticmethod
    def empty_frame() -> pd.DataFrame:
        """The table of a run sampled never (sampling off)."""
        return pd.DataFrame({"time_s": np.empty(0), "entity": pd.Categorical([]),
                             "metric": pd.Categorical([]), "value": np.empty(0)})


def default_period_s(span_s: float) -> float:
    """About 200 samples over the trace's recorded span, at least one a second."""
    return max(1.0, span_s / 200.0)


def instance_utilization(series: pd.DataFrame) -> pd.DataFrame:
    """Per instance, from the samples: KV occupancy mean and P99, share of time at full memory,
    share of time its queue was blocked on memory, mean queue depth."""
    wide = series.pivot_table(index=["entity", "time_s"], columns="metric", values="value",
                              observed=True)
    if "kv_occupancy" not in wide:
        return pd.DataFrame(columns=["kv_occupancy_mean", "kv_occupancy_p99", "kv_full_share",
                                     "memory_blocked_share", "queue_depth_mean"])
    g = wide.dropna(subset=["kv_occupancy"]).groupby(level="entity", observed=True)
    return pd.DataFrame({
        "kv_occupancy_mean": g["kv_occupancy"].mean(),
        "kv_occupancy_p99": g["kv_occupancy"].quantile(0.99),
        "kv_full_share": g["kv_occupancy"].apply(lambda s: float((s >= FULL).mean())),
        "memory_blocked_share": g["memory_blocked"].mean(),
        "queue_depth_mean": g["queue_depth"].mean(),
    })


def link_utilization(series: pd.DataFrame) -> pd.DataFrame:
    """Per link, from the samples: mean and P99 of the share of what background load leaves that
    our transfers used (by bytes of transfers completed in each window), flows in flight."""
    rows = series[series["metric"].isin(["utilization", "flows_in_flight"])]
    wide = rows.pivot_table(index=["entity", "time_s"], columns="metric", values="value",
                            observed=True)
    if "utilization" not in wide:
        return pd.DataFrame(columns=["utilization_mean", "utilization_p99", "flows_in_flight_mean"])
    g = wide.groupby(level="entity", observed=True)
    return pd.DataFrame({
        "utilization_mean": g["utilization"].mean(),
        "utilization_p99": g["utilization"].quantile(0.99),
        "flows_in_flight_mean": g["flows_in_flight"].mean(),
    })


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
