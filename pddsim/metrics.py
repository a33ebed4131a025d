"""Per-request records and the run summary.

Finished requests leave one row in compact columns (8 bytes a field), so a million-request run keeps
its records without keeping its Request objects.
"""
from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import pandas as pd

from pddsim.engine.request import NO_TIME, Request
from pddsim.system.routes import Route
from pddsim.system.stages import STAGES
from pddsim.workload.model import TraceTable
from pddsim.workload.stats import BUCKETS, bucket_index

FLOAT_COLUMNS = ("arrival_s", "ttft_s", "tpot_s", "itl_max_s", "e2e_s", "finish_s", "wan_bytes",
                 "wan_bytes_no_drc", "rdma_bytes", "handoff_stall_s")
STAGE_COLUMNS = tuple(f"stage_{s}_s" for s in STAGES)         # share of the E2E latency
TTFT_STAGE_COLUMNS = tuple(f"ttft_{s}_s" for s in STAGES)     # share of the TTFT
INT_COLUMNS = ("request", "session", "input_tokens", "output_tokens", "tokens_out", "hit_tokens",
               "hit_tokens_decode", "handoffs", "handoff_tail_tokens", "relay_tokens", "follows")
TRACE_COLUMNS = {"session": "session_id", "follows": "follows"}   # the workload's, not recorded
RECORDED_INTS = tuple(c for c in INT_COLUMNS if c not in TRACE_COLUMNS)


class Recorder:
    """Collects one row per ended request. A row goes into a small row-major buffer of Python
    numbers (a list takes them as they are: an array would convert each one); every `flush_rows`
    rows the buffer is split into the per-column arrays, which `frame` can reorder one at a
    time."""

    def __init__(self, flush_rows: int = 4096):
        self.flush_rows = flush_rows
        # per request: its float fields, its E2E stages, then its TTFT stages
        self.floats = {c: array("d") for c in FLOAT_COLUMNS + STAGE_COLUMNS + TTFT_STAGE_COLUMNS}
        self.ints = {c: array("q") for c in RECORDED_INTS}
        self.pipeline = array("b")
        self.failure = array("q")
        self._float_rows: list[float] = []
        self._int_rows: list[int] = []    # RECORDED_INTS, then the pipeline's and failure's codes
        self._pipelines: dict[str, int] = {}
        self._failures: dict[str, int] = {"": 0}

    def record(self, req: Request) -> None:
        first, end, arrival = req.first_token_s, req.finish_s, req.arrival_s
        assert end is not None, "recorded before it ended"
        self._float_rows.extend((         # in `self.floats` order: FLOAT_COLUMNS, then the stages
            arrival,
            np.nan if first is None else first - arrival,
            (req.last_token_s - first) / (req.tokens_out - 1)
            if first is not None and req.tokens_out > 1 else np.nan,
            req.max_gap_s, end - arrival, end, req.wan_bytes, req.wan_bytes_no_drc,
            req.rdma_bytes, req.handoff_stall_s))
        self._float_rows.extend(req.stages)
        self._float_rows.extend(req.ttft_stages or NO_TIME)    # no token: none
        self._int_rows.extend((           # in RECORDED_INTS order, then the codes
            req.idx, req.input_tokens, req.output_tokens, req.tokens_out,
            req.hit_tokens, req.hit_tokens_decode, req.handoffs, req.handoff_tail_tokens,
            req.relay_tokens,
            self._pipelines.setdefault(req.pipeline, len(self._pipelines)),
            self._failures.setdefault(req.failed or "", len(self._failures))))
        if len(self._int_rows) >= self.flush_rows * (len(RECORDED_INTS) + 2):
            self._flush()

    def _flush(self) -> None:
        groups: tuple[tuple[list, list[array], Any], ...] = (
            (self._float_rows, list(self.floats.values()), np.float64),
            (self._int_rows, [*self.ints.values(), self.pipeline, self.failure], np.int64))
        for rows, columns, dtype in groups:
            table = np.fromiter(rows, dtype=dtype, count=len(rows)).reshape(-1, len(columns))
            for k, column in enumerate(columns):
                column.frombytes(table[:, k].astype(column.typecode).tobytes())
            del table
            del rows[:]

    def frame(self, slo, trace: TraceTable) -> pd.DataFrame:
        """The records in request order, as a frame, with each request's session and the request
        it follows read from the workload's `trace`; consumes the recorder. Rows arrive in end
        order: each column is reordered on its own and its buffer released before the next, and
        the frame takes the reordered arrays as they are, so the peak stays near one copy of the
        records (a million-request run)."""
        self._flush()
        order = np.argsort(np.frombuffer(self.ints["request"], dtype=np.int64), kind="stable")
        columns: dict[str, np.ndarray] = {}
        for c in FLOAT_COLUMNS:
            columns[c] = np.frombuffer(self.floats.pop(c), dtype=np.float64)[order]
        for c in INT_COLUMNS:
            columns[c] = (trace.column(TRACE_COLUMNS[c])[columns["request"]] if c in TRACE_COLUMNS
                          else np.frombuffer(self.ints.pop(c), dtype=np.int64)[order])
        for c in STAGE_COLUMNS + TTFT_STAGE_COLUMNS:
            columns[c] = np.frombuffer(self.floats.pop(c), dtype=np.float64)[order]
        df = pd.DataFrame(columns, copy=False)
        pipeline = np.frombuffer(self.pipeline, dtype=np.int8)[order]
        failure = np.frombuffer(self.failure, dtype=np.int64)[order]
        df["pipeline"] = pd.Categorical.from_codes(pipeline,
                                                   categories=[str(p) for p in self._pipelines])
        # string columns as a take from their few distinct values: pandas builds its (pyarrow)
        # strings once per value, not once per row
        df["failure"] = pd.Series(list(self._failures)).array.take(failure)
        df["status"] = pd.Series(["completed", "failed"]).array.take((failure != 0).astype(np.intp))
        df["hit_rate"] = (df["hit_tokens"] / df["input_tokens"].clip(lower=1)).clip(upper=1.0)
        df["hit_bucket"] = pd.Categorical.from_codes(bucket_index(df["hit_rate"].to_numpy()),
                                                     categories=BUCKETS)
        df["slo_met"] = ((failure == 0) & (df["ttft_s"] <= slo.ttft_s)
                         & (df["tpot_s"].fillna(0.0) <= slo.tpot_s))
        return df


def met_slo(req: Request, slo) -> bool:
    """One ended request's `slo_met` as `Recorder.frame` computes it for all."""
    first = req.first_token_s
    if req.failed or first is None or first - req.arrival_s > slo.ttft_s:
        return False
    return req.tokens_out < 2 or (req.last_token_s - first) / (req.tokens_out - 1) <= slo.tpot_s


def _mean(values: np.ndarray) -> float:
    """Mean of the values that are not NaN (NaN if none), summed as pandas sums them."""
    missing = np.isnan(values)
    n = len(values) - int(missing.sum())
    if not n:
        return float("nan")
    return float((np.where(missing, 0.0, values) if n < len(values) else values).sum() / n)


def _pct(values: np.ndarray, q: float) -> float:
    values = values[~np.isnan(values)]
    return float(np.percentile(values, q)) if len(values) else float("nan")


def _share(mask: np.ndarray) -> float:
    return float(mask.mean()) if len(mask) else 0.0


def _pool_busy(instances: pd.DataFrame, role: str) -> float:
    pool = instances[instances["role"] == role]
    return float(pool["busy_share"].mean()) if len(pool) else 0.0


def achieved_rps(df: pd.DataFrame) -> float:
    """Requests issued per second between the first issue and the last (N - 1 gaps over the span):
    the load a run actually offered. In closed loop a slow system slows its agents down, so this is
    measured, never read off the trace's schedule."""
    issued = df["arrival_s"].to_numpy()
    span = float(issued.max() - issued.min()) if len(issued) else 0.0
    return (len(issued) - 1) / span if span > 0 else float("nan")


def turns_out_of_order(df: pd.DataFrame) -> float:
    """Share of the requests that follow another (`follows`) issued before that one ended. An agent
    cannot do that; open-loop replay of a time-scaled session trace can (it compresses think times
    and the trace's guessed service times), and it lowers hit rates. Closed loop: 0 by construction."""
    follows = df["follows"].to_numpy()
    turns = follows >= 0
    if not turns.any():
        return float("nan")
    finish = np.full(int(max(df["request"].max(), follows.max())) + 1, np.nan)
    finish[df["request"].to_numpy()] = df["finish_s"].to_numpy()
    return float(np.mean(df["arrival_s"].to_numpy()[turns] < finish[follows[turns]]))


def summarize(df: pd.DataFrame, instances: pd.DataFrame, *, system: str, sim_duration_s: float,
              cost_per_hour: float) -> dict:
    """The run's headline figures, all SI units. Latency statistics are over completed requests;
    a statistic with no sample (no handoff in a PD run, say) is None. Computed on the columns'
    arrays: a capacity search summarises every run it makes."""
    col = {c: df[c].to_numpy() for c in df.columns if c not in ("pipeline", "failure", "status",
                                                                 "hit_bucket")}
    completed = (df["status"] == "completed").to_numpy()
    n_done = int(completed.sum())

    def done_only(values: np.ndarray) -> np.ndarray:
        """The completed requests' values: the column itself when all completed, else a copy
        (one column at a time: a million-request run's records are not copied whole)."""
        return values if n_done == len(values) else values[completed]

    done = {c: done_only(col[c]) for c in ("ttft_s", "tpot_s", "itl_max_s", "e2e_s", "tokens_out",
                                           "input_tokens")}
    pipeline = df["pipeline"].cat
    routes = list(pipeline.categories)
    codes = pipeline.codes.to_numpy()

    def route_is(*names: str) -> np.ndarray:
        return np.isin(codes, [routes.index(n) for n in names if n in routes])

    dur = max(sim_duration_s, 1e-12)
    met = int(col["slo_met"].sum())
    goodput = met / dur
    to_decoder = route_is(Route.P_D.value, Route.P_MD.value, Route.P_RLD_MD.value)
    handed = col["handoffs"] > 0
    summary = {
        "system": system,
        "requests_total": int(len(df)),
        "requests_completed": n_done,
        "requests_failed": int(len(df)) - n_done,
        "sim_duration_s": float(sim_duration_s),
        "achieved_rps": achieved_rps(df),
        "turns_out_of_order": turns_out_of_order(df),
        "ttft_mean_s": _mean(done["ttft_s"]),
        "ttft_p50_s": _pct(done["ttft_s"], 50),
        "ttft_p90_s": _pct(done["ttft_s"], 90),
        "ttft_p99_s": _pct(done["ttft_s"], 99),
        "tpot_mean_s": _mean(done["tpot_s"]),
        "tpot_p99_s": _pct(done["tpot_s"], 99),
        "itl_max_p99_s": _pct(done["itl_max_s"], 99),
        "e2e_p50_s": _pct(done["e2e_s"], 50),
        "e2e_p99_s": _pct(done["e2e_s"], 99),
        "slo_attainment": met / max(len(df), 1),
        "goodput_rps": goodput,
        "throughput_rps": n_done / dur,
        "output_tokens_per_s": float(done["tokens_out"].sum()) / dur,
        "cost_per_hour": cost_per_hour,
        "bcr": goodput * 3600.0 / cost_per_hour,
        "prefix_hit_rate": float(col["hit_tokens"].sum() / max(col["input_tokens"].sum(), 1)),
        "wan_bytes": float(col["wan_bytes"].sum()),
        "rdma_bytes": float(col["rdma_bytes"].sum()),
        "rld_token_share": float(col["relay_tokens"].sum() / max(col["tokens_out"].sum(), 1)),
        "pipeline_p_md": _share(route_is(Route.P_MD.value)),
        "pipeline_p_rld_md": _share(route_is(Route.P_RLD_MD.value)),
        "pipeline_rld_only": _share(route_is(Route.P_RLD.value)),
        "handoffs_one_shot": int((col["handoffs"] == 1).sum()),
        "handoffs_catch_up": int((col["handoffs"] > 1).sum()),
        "handoff_stall_p99_s": _pct(col["handoff_stall_s"][handed], 99),
        "prefix_hit_rate_md": float(col["hit_tokens_decode"][to_decoder].sum()
                                    / max(col["input_tokens"][to_decoder].sum(), 1)),
        "wan_bytes_no_drc": float(col["wan_bytes_no_drc"].sum()),
        "rld_utilization": _pool_busy(instances, "relay"),
        "md_utilization": _pool_busy(instances, "decode"),
    }
    for name, stage, ttft_stage in zip(STAGES, STAGE_COLUMNS, TTFT_STAGE_COLUMNS):
        values, ttft_values = done_only(col[stage]), done_only(col[ttft_stage])
        summary[f"stage_{name}_mean_s"] = _mean(values)
        summary[f"stage_{name}_p90_s"] = _pct(values, 90)
        summary[f"ttft_stage_{name}_mean_s"] = _mean(ttft_values)
        summary[f"ttft_stage_{name}_p90_s"] = _pct(ttft_values, 90)
    summary.update(serving_benchmark_names(done, len(df), met, dur))
    return {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in summary.items()}


BENCH_STATS = ("mean", "median", "std", "p90", "p95", "p99")
BENCH_KEYS = ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
              "request_throughput", "request_goodput", "output_throughput",
              "total_token_throughput") + tuple(
    f"{stat}_{name}" for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms") for stat in BENCH_STATS)


def headline(summary: dict) -> dict:
    """The summary without its per-stage and serving-benchmark-named keys (shown as tables or
    kept for `--json`): what a person reads first."""
    return {k: v for k, v in summary.items()
            if not k.startswith(("stage_", "ttft_stage_")) and k not in BENCH_KEYS}


def serving_benchmark_names(done: dict[str, np.ndarray], requests: int, slo_met: int,
                            duration_s: float) -> dict:
    """The same run under the names serving benchmarks print (vLLM `bench serve`, SGLang
    `bench_serving`), in their units (ms), so a simulated run reads beside a measured one.
    `done` holds the completed requests' columns.

    Inter-token latency: pddsim keeps no per-token log, so `mean_itl_ms` is exact (all gaps over
    all completed requests, i.e. the gap-weighted mean of TPOT) while its median, std and
    percentiles are over each request's mean gap, weighted by its number of gaps."""
    completed = len(done["ttft_s"])
    out = {
        "completed": completed,
        "failed": requests - completed,
        "duration": float(duration_s),
        "total_input_tokens": int(done["input_tokens"].sum()),
        "total_output_tokens": int(done["tokens_out"].sum()),
        "request_throughput": completed / duration_s,
        "request_goodput": float(slo_met) / duration_s,
        "output_throughput": float(done["tokens_out"].sum()) / duration_s,
        "total_token_throughput": float(done["input_tokens"].sum() + done["tokens_out"].sum())
        / duration_s,
    }
    gaps = (done["tokens_out"] - 1).clip(min=0).astype(float)
    series = {"ttft_ms": (done["ttft_s"] * 1e3, None),
              "tpot_ms": (done["tpot_s"] * 1e3, None),
              "itl_ms": (done["tpot_s"] * 1e3, gaps),
              "e2el_ms": (done["e2e_s"] * 1e3, None)}
    for name, (values, weights) in series.items():
        keep = ~np.isnan(values) if weights is None else ~np.isnan(values) & (weights > 0)
        stats = _weighted_stats(values[keep], None if weights is None else weights[keep])
        out.update({f"{stat}_{name}": v for stat, v in stats.items()})
    return out


def _weighted_stats(values: np.ndarray, weights: np.ndarray | None) -> dict:
    if not len(values):
        return dict.fromkeys(BENCH_STATS, float("nan"))
    if weights is None:     # the plain statistics a benchmark prints
        p90, p95, p99 = np.percentile(values, [90, 95, 99])
        return {"mean": float(np.mean(values)), "median": float(np.median(values)),
                "std": float(np.std(values)), "p90": float(p90), "p95": float(p95),
                "p99": float(p99)}
    order = np.argsort(values, kind="stable")
    v, cw = values[order], np.cumsum(weights[order])

    def q(p):      # the smallest value with at least p of the weight at or below it
        return float(v[np.searchsorted(cw, p * cw[-1], side="left")])

    mean = float(np.average(values, weights=weights))
    return {"mean": mean, "median": q(0.5),
            "std": float(np.sqrt(np.average((values - mean) ** 2, weights=weights))),
            "p90": q(0.9), "p95": q(0.95), "p99": q(0.99)}


def stage_table(summary: dict) -> pd.DataFrame:
    """Where the time went, one row per stage: mean and P90 seconds of TTFT and of E2E."""
    rows = {name: {"ttft_mean_s": summary[f"ttft_stage_{name}_mean_s"],
                   "ttft_p90_s": summary[f"ttft_stage_{name}_p90_s"],
                   "e2e_mean_s": summary[f"stage_{name}_mean_s"],
                   "e2e_p90_s": summary[f"stage_{name}_p90_s"]} for name in STAGES}
    table = pd.DataFrame.from_dict(rows, orient="index").astype(float)
    total = table["e2e_mean_s"].sum()
    table["e2e_share"] = table["e2e_mean_s"] / total if total > 0 else 0.0
    return table


def by_bucket(df: pd.DataFrame) -> pd.DataFrame:
    """TTFT and SLO attainment per hit-rate bucket: where the tail latency lives."""
    g = df.groupby("hit_bucket", observed=False)
    return pd.DataFrame({
        "requests": g.size(),
        "share": g.size() / max(len(df), 1),
        "ttft_p50_s": g["ttft_s"].median(),
        "ttft_p90_s": g["ttft_s"].quantile(0.9),
        "ttft_p99_s": g["ttft_s"].quantile(0.99),
        "slo_attainment": g["slo_met"].mean(),
    })
