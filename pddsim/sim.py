"""The one entry point: `simulate(config, workload, seed) -> Result`.

Everything a run needs is in its arguments and everything it produces is in the Result, so the CLI,
sweeps, notebooks and tests all call this, and a sweep can ship it to another process.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import cached_property, partial
from math import nan
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import simpy

from pddsim.config import MAX_SAMPLES, AgentSynthetic, Config
from pddsim.cost import cost_per_hour, revenue_summary
from pddsim.engine import clock
from pddsim.engine.invariants import CheckedEnvironment, FlowLog, Invariants
from pddsim.engine.request import Request
from pddsim.errors import InputError, InvariantError
from pddsim.metrics import Recorder, summarize
from pddsim.provenance import provenance
from pddsim.provenance import write as write_provenance
from pddsim.sessions import session_summary, session_table
from pddsim.stationary import steady_summary
from pddsim.system.deployment import Deployment, build, check_fits
from pddsim.system.faults import STALLED, FaultInjector
from pddsim.system.pdd import PDD
from pddsim.system.pipelines import Colocated, Disaggregated, FaultsFactory, Pipeline
from pddsim.system.routers import make_router
from pddsim.system.scaling import Elastic
from pddsim.system.stages import FRONTEND, PREFILL_QUEUE
from pddsim.timeline import Timeline
from pddsim.timeseries import (
    INSTANCE_UTILIZATION,
    Sampler,
    default_period_s,
    utilization_summary,
    window_table,
)
from pddsim.workload.horizon import poisson_starts, resample
from pddsim.workload.model import CLOCK_LIMIT_S, Workload
from pddsim.workload.readers import read_workload
from pddsim.workload.replay import Replay
from pddsim.workload.synthetic import agent_workload, generate

RUN_TABLES = ("requests", "sessions", "instances", "links", "timeseries", "windows")
# every file `Result.write` may leave, in any of its formats
RUN_FILES = tuple(f"{t}.{fmt}" for t in RUN_TABLES for fmt in ("parquet", "csv", "jsonl")) + (
    "summary.json", "provenance.json")


def prepare_out_dir(out_dir: str | Path, *, runs_below: bool = False) -> Path:
    """`out_dir` made ready for a run's files before anything is simulated: created, or the files
    an earlier run left there removed (and, with `runs_below`, those of the runs in its subfolders,
    as a comparison writes them), so that no stale table lies beside new ones and `pddsim report`
    never mixes two runs. Other files are left alone; a file in the folder's place is refused."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder (--out names a folder)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        below = [p for p in sorted(out.iterdir()) if (p / "summary.json").is_file()] if runs_below else []
        for folder in (out, *below):
            for name in RUN_FILES:
                (folder / name).unlink(missing_ok=True)
        for folder in below:
            if not any(folder.iterdir()):
                folder.rmdir()
    except OSError as e:
        raise InputError(f"{out}: cannot prepare the folder ({e.strerror})") from None
    return out


@dataclass
class Result:
    summary: dict
    requests: pd.DataFrame
    links: dict[str, dict[str, float]]      # per link: bytes carried, busy seconds, flows
    instances: pd.DataFrame                 # per instance: role, busy share, tokens, preemptions, KV peak
    sessions: pd.DataFrame                  # per agent session: completion time and slowdown
    timeseries: pd.DataFrame                # sampled state: time_s, entity, metric, value
    window_s: float                         # the width of `windows` (the sampling period)
    cfg: Config                             # what ran, for its provenance
    seed: int
    wall_s: float                           # host time the run took (not a result: run_info)
    timeline: Timeline | None = None        # kept when config.observe.timeline is on

    def provenance(self) -> dict:
        """What produced this result (`pddsim.provenance`)."""
        return provenance(self.cfg, self.seed, self.wall_s)

    @cached_property
    def windows(self) -> pd.DataFrame:
        """Per arrival window and hit bucket: rate, TTFT, SLO; built when first asked (a
        capacity search or a plan never asks)."""
        return window_table(self.requests, self.window_s)

    def write(self, out_dir: str | Path, requests_format: str = "parquet") -> None:
        """Every table of the run into `out_dir` (Parquet; the per-request table optionally as
        CSV or JSON lines), with the summary as JSON and what produced them
        (`provenance.json`): what `pddsim report` reads."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if requests_format == "csv":
            self.requests.to_csv(out / "requests.csv", index=False)
        elif requests_format == "jsonl":
            self.requests.to_json(out / "requests.jsonl", orient="records", lines=True)
        else:
            self.requests.to_parquet(out / "requests.parquet", index=False)
        self.sessions.to_parquet(out / "sessions.parquet", index=False)
        self.instances.to_parquet(out / "instances.parquet", index=False)
        links = pd.DataFrame.from_dict(self.links, orient="index").rename_axis("link")
        links.reset_index().to_parquet(out / "links.parquet", index=False)
        self.timeseries.to_parquet(out / "timeseries.parquet", index=False)
        self.windows.to_parquet(out / "windows.parquet", index=False)
        (out / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
        write_provenance(self.provenance(), out / "provenance.json")


def make_pipeline(env, cfg: Config, dep: Deployment, routers, on_end, seed: int, tracer=None,
                  faults: FaultsFactory | None = None):
    """The pipeline the deployment's roles call for; `faults` builds its FaultInjector."""
    if "colocated" in dep.pools:
        return Colocated(env, dep, routers, on_end, tracer, faults)
    if "relay" in dep.pools:
        return PDD(env, dep, routers, on_end, cfg.pdd, np.random.default_rng([seed, 4]), tracer,
                   faults)
    return Disaggregated(env, dep, routers, on_end, tracer, cfg.policies.offload_above_tokens, faults)


def load_workload(cfg: Config, source: Workload | None = None) -> Workload:
    """The workload a config names: a trace file or a seeded synthetic generator; with
    `workload.horizon_s`, sessions started over the horizon at `session_rate_rps` (an Agent
    generator's own, any other workload's resampled: `source`, when given, is that workload as
    read, so that a search over rates reads it once). Refused if a run could not serve it."""
    workload = _read_or_generate(cfg, source)
    check_servable(cfg, workload)
    return workload


def _read_or_generate(cfg: Config, source: Workload | None) -> Workload:
    w = cfg.workload
    if w.horizon_s is not None:
        assert w.session_rate_rps is not None        # the config requires it
        if isinstance(w.synthetic, AgentSynthetic):
            starts = poisson_starts(w.session_rate_rps, w.horizon_s,
                                    np.random.default_rng([cfg.seed, 7]))
            return agent_workload(w.synthetic.knobs, cfg.seed, starts)
        base = source if source is not None else _read_or_generate(
            cfg.model_copy(update={"workload": w.model_copy(update={"horizon_s": None})}), None)
        return resample(base, w.session_rate_rps, w.horizon_s, cfg.seed)
    if w.synthetic is not None:
        return generate(w.synthetic, seed=cfg.seed)
    assert w.trace is not None          # the config requires exactly one source
    return read_workload(cfg.resolve(w.trace), w.format, limit=w.limit,
                         shared_prefix=w.shared_prefix, max_tokens=w.max_tokens)


def check_servable(cfg: Config, workload: Workload) -> None:
    """Refuse a workload whose run could not end or could not be measured: a request no instance
    can ever hold would only be decoded token by token until it fails (1e12 output tokens: hours
    of simulation), one replayed past the clock's resolution would have its latencies rounded
    away (a request at 1e17 s showed TTFT 0)."""
    where = "workload.synthetic" if cfg.workload.synthetic is not None else workload.source
    fix = ("lower its lengths" if cfg.workload.synthetic is not None
           else "clip it with workload.max_tokens")
    largest = check_fits(cfg)
    scale = cfg.workload.time_scale
    reqs = workload.requests
    need = reqs.column("input_tokens") + reqs.column("output_tokens")
    late = reqs.column("arrival_s") / scale + reqs.column("think_s")
    for i in np.flatnonzero((need > largest) | (late > CLOCK_LIMIT_S))[:1].tolist():  # the first
        r = reqs[i]
        if r.input_tokens + r.output_tokens > largest:
            raise InputError(
                f"{where}: request {i} (arriving at {r.arrival_s:g} s) needs {r.input_tokens} + "
                f"{r.output_tokens} tokens, more than any instance's KV memory holds ({largest}); "
                f"{fix}")
        if r.arrival_s / scale + r.think_s > CLOCK_LIMIT_S:
            raise InputError(
                f"{where}: request {i} is replayed at {r.arrival_s / scale:g} s (time_scale "
                f"{scale:g}) after {r.think_s:g} s of thinking, past {CLOCK_LIMIT_S:g} s, the latest "
                f"time the simulated clock resolves to a microsecond")


def sample_period_s(cfg: Config, workload: Workload) -> float:
    """The time series' sampling period: the configured one or about 200 samples over the trace's
    span as replayed (a time scale stretches or squeezes it); refused when it would take more than
    MAX_SAMPLES samples per series over that span."""
    arrivals = workload.requests.column("arrival_s")
    span_s = (float(arrivals.max()) if len(arrivals) else 0.0) / cfg.workload.time_scale
    period_s = cfg.observe.sample_s
    if period_s is None:
        return default_period_s(span_s)
    if period_s > 0 and span_s / period_s > MAX_SAMPLES:
        raise InputError(f"observe.sample_s: {period_s:g} s takes {span_s / period_s:.3g} samples "
                         f"per series over the trace's {span_s:g} s, more than {MAX_SAMPLES:,}; "
                         f"at least {span_s / MAX_SAMPLES:.3g} s")
    return period_s


def run_through_faults(env, daemons, pipeline, replay: Replay,
                       in_flight: dict[int, Request]) -> None:
    """Run to the end with faults: when nothing but periodic processes is left (a transfer on a
    line that never comes back, a pool that never restarts), the requests still in flight fail as
    `stalled` and the run goes on (a closed loop issues the turns that follow them)."""
    def run_until(until) -> bool:
        """Run until `until`; False if the run got stuck first."""
        daemons.stuck = env.event()
        try:
            env.run(until=env.any_of([until, daemons.stuck]))
        except RuntimeError as e:           # SimPy: nothing at all is scheduled
            if isinstance(e, InvariantError) or env.peek() != float("inf"):
                raise
        daemons.stuck = None
        return until.triggered

    while not run_until(replay.all_ended):
        if not in_flight:
            raise InvariantError("the run is stuck with no request in flight")
        for req in list(in_flight.values()):
            pipeline.give_up(req, STALLED)
    if not run_until(pipeline.drained()):   # ended requests' work stalled for good: let it go
        pipeline.abandon_leftovers()
        if not run_until(pipeline.drained()):
            raise InvariantError(f"{pipeline.leftovers} piece(s) of ended requests' work never drain")


def simulate(cfg: Config, workload: Workload, seed: int | None = None,
             on_progress: Callable[[int], None] | None = None,
             check_invariants: bool = False,
             stop_when: Callable[[Request], bool] | None = None,
             on_built: Callable[[simpy.Environment, Deployment, Pipeline], None] | None = None,
             ) -> Result:
    """Run `workload` through the deployment `cfg` describes. `on_progress(n)` is told as each
    request ends (for a progress bar); it cannot change the run. `check_invariants` checks the
    engine's rules after every event (see `engine/invariants.py`): slower, same results.
    `stop_when(request)` is asked as each request ends: True stops the run there (a capacity
    search's run that can no longer pass); its Result covers the requests ended so far and its
    summary says `stopped_early`. A run with faults is never stopped. `on_built(env, deployment,
    pipeline)` is shown the run's live objects before the first request arrives (to look inside a
    run, or add checks to a `CheckedEnvironment`'s, rather than patch the engine)."""
    wall0 = time.perf_counter()
    seed = cfg.seed if seed is None else seed
    env = CheckedEnvironment() if check_invariants else simpy.Environment()
    checks: Invariants | None = None
    recorder = Recorder()
    routers = {pool: make_router(getattr(cfg.policies, f"{pool}_router"))
               for pool in ("prefill", "decode", "relay")}
    replay: Replay                      # created below: it needs the pipeline, which needs on_end
    elastic: Elastic | None = None      # created below, when a group scales
    in_flight: dict[int, Request] = {}     # issued, not ended: each request ends exactly once
    timeline = Timeline(cfg.observe.timeline_limit) if cfg.observe.timeline else None

    def on_end(req: Request) -> None:
        if in_flight.pop(req.idx, None) is not req:
            raise InvariantError(f"request {req.idx} ended twice (or something else ended in its name)")
        if checks is not None:
            checks.request_ended(req)
        if elastic is not None:
            elastic.request_ended(req)
        recorder.record(req)
        if timeline is not None:
            timeline.request(req)
        replay.request_ended(req.idx)
        if on_progress is not None:
            on_progress(1)
        if stop_when is not None and not stopped.triggered and stop_when(req):
            stopped.succeed()

    flow_log = FlowLog() if isinstance(env, CheckedEnvironment) else None
    dep = build(env, cfg, seed, timeline, flow_log)
    pipeline = make_pipeline(env, cfg, dep, routers, on_end, seed, timeline, None if cfg.faults is None else
                             partial(FaultInjector, env, cfg.faults, dep,
                                     rng=np.random.default_rng([seed, 5]), in_flight=in_flight))
    faults = pipeline.faults
    reqs = workload.requests
    # read a request at a time from the workload's columns (no trace entry made per request)
    inputs, outputs, chains, blocks = (reqs.input_tokens, reqs.output_tokens, reqs.hash_ids,
                                       reqs.block_tokens)
    all_instances = [i for members in dep.members.values() for i in members]
    period_s = sample_period_s(cfg, workload)
    sampler = Sampler(env, all_instances, dep.links, period_s, dep.daemons,
                      timeline) if period_s > 0 else None
    if faults is not None:
        faults.start()
    if isinstance(env, CheckedEnvironment):
        assert flow_log is not None
        checks = Invariants(env, all_instances, dep.links, flow_log,
                            None if faults is None else faults.is_down)
    dispatch = pipeline.dispatch if faults is None else faults.dispatch
    if Elastic.needed(cfg):
        elastic = Elastic(env, cfg, pipeline.dep, pipeline, in_flight, faults)
        if sampler is not None:
            sampler.held = elastic.is_held
    if on_built is not None:
        on_built(env, dep, pipeline)

    # the serving front end holds each request this long (and a random extra) before the engine
    # sees it, after its turn in the serving process, which takes requests one at a time
    front = cfg.engine_profile()
    frontend_s, jitter_s = front.frontend_ms / 1e3, front.frontend_jitter_ms / 1e3
    serial_s = front.frontend_serial_ms / 1e3
    per_stream_s = front.frontend_stream_us / 1e6
    jitter = np.random.default_rng([seed, 6])
    serving_free_at = 0.0

    # passed positionally below: a class called with keywords gathers them into a dict first
    keep_log = timeline is not None

    def issue(idx: int) -> None:
        nonlocal serving_free_at
        if not frontend_s and not jitter_s and not serial_s and not per_stream_s:
            req = in_flight[idx] = Request(idx, inputs[idx], outputs[idx], chains[idx], blocks[idx],
                                           clock.now(env), PREFILL_QUEUE, keep_log)
            dispatch(req)
            return
        now = clock.now(env)
        req = in_flight[idx] = Request(idx, inputs[idx], outputs[idx], chains[idx], blocks[idx],
                                       now, FRONTEND, keep_log)
        serving_free_at = max(now, serving_free_at) + serial_s
        delay = (serving_free_at - now + frontend_s + per_stream_s * (len(in_flight) - 1)
                 + (jitter.exponential(jitter_s) if jitter_s else 0.0))
        clock.timeout(env, delay, then=lambda _e: dispatch(req))

    replay = Replay(env, workload, cfg.workload, np.random.default_rng([seed, 3]), issue)
    replay.start()
    stopped = env.event()
    if faults is None:
        env.run(until=env.any_of([replay.all_ended, stopped]))
        if not stopped.triggered:
            env.run(until=pipeline.drained())
    else:
        run_through_faults(env, pipeline.dep.daemons, pipeline, replay, in_flight)
    if checks is not None and not stopped.triggered:
        checks.at_end(in_flight)
    df = recorder.frame(cfg.slo, reqs)
    series = sampler.frame() if sampler is not None else Sampler.empty_frame()
    links = {link.name: {"bytes": link.bytes_carried, "busy_s": link.busy_s,
                         "flows": link.flows_started,
                         "throughput_Bps": link.bytes_carried / max(clock.now(env), 1e-12)}
             for link in pipeline.dep.links}
    for name, figures in (sampler.link_utilization() if sampler is not None else {}).items():
        links[name].update(figures)
    def held_s(inst) -> float:
        return clock.now(env) if elastic is None else elastic.held_s(inst, 0.0, clock.now(env))
    instances = pd.DataFrame([
        {"instance": i.name, "role": i.role,
         # an instance never held has no busy share (NaN: left out of its pool's mean)
         "busy_share": i.busy_s / max(held_s(i), 1e-12) if elastic is None or held_s(i) else nan,
         "tokens_decoded": i.tokens_decoded, "preemptions": i.preemptions,
         "kv_capacity_tokens": i.capacity, "kv_peak_tokens": i.kv_peak,
         "held_s": held_s(i)}
        for i in all_instances])
    instances = instances.join(sampler.instance_utilization() if sampler is not None
                               else pd.DataFrame(columns=list(INSTANCE_UTILIZATION)), on="instance")
    sessions = session_table(cfg, workload, df)
    # a benchmark's warm-up requests are left out of its figures, which cover its measured phase
    measured, span = df, clock.now(env)
    if workload.warmup:
        df["warmup"] = df["request"].to_numpy() < workload.warmup
        measured = df[~df["warmup"]].reset_index(drop=True)
        span = clock.now(env) - float(measured["arrival_s"].min())
    t0 = clock.now(env) - span
    summary = summarize(measured, instances, system=cfg.name, sim_duration_s=span,
                        cost_per_hour=cost_per_hour(
                            cfg, None if elastic is None else elastic.mean_gpus(t0, clock.now(env))))
    summary["warmup_requests"] = workload.warmup
    # the SLO its attainment, goodput and BCR are measured against: summaries compare only with it
    summary.update(slo_ttft_s=cfg.slo.ttft_s, slo_tpot_s=cfg.slo.tpot_s, slo_target=cfg.slo.target)
    summary["stopped_early"] = stopped.triggered
    summary.update(steady_summary(measured))
    summary.update(revenue_summary(measured, cfg, span, summary["cost_per_hour"]))
    summary.update(utilization_summary(instances, links))
    summary.update(session_summary(sessions))
    if faults is not None:
        summary.update(faults.summary(df, clock.now(env)))
    if elastic is not None:
        summary.update(elastic.summary(measured["arrival_s"].to_numpy(),
                                       measured["finish_s"].to_numpy(), t0, clock.now(env)))
    return Result(summary=summary, requests=df, links=links, instances=instances, sessions=sessions,
                  timeseries=series, window_s=period_s if period_s > 0 else clock.now(env) or 1.0,
                  cfg=cfg, seed=seed, wall_s=time.perf_counter() - wall0, timeline=timeline)
