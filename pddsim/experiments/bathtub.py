"""Throughput against prefix hit rate at a fixed context length and load (PDD.md 5: the bathtub).

Each point replays the same Poisson stream of equal-length requests whose first `hit_rate` of the
prompt is a prefix every request shares, so the prefill computes only the rest. The stream starts
when a first request has put that prefix in a cache (closed-loop replay: every other request
follows it by its Poisson offset), so the hit rate is the one asked for, not diluted by a cold
start; each further prefill instance's first request still misses, as it would. A policy is a
`batching.chunk_packing` value: with `alone`, each iteration computes one request's chunk, and a
short tail chunk pays a whole iteration's weight read and fixed overhead by itself; with `packed`,
tails of several requests share an iteration. Nothing here shapes the curve: it is whatever the
engine and the performance model make of the stream. `computed_tokens_per_s` (uncached prompt
tokens computed per second) is where a tail chunk's waste shows: it dips just past the hit rates
at which the uncached remainder crosses a multiple of the chunk size.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from pddsim.config import Config
from pddsim.errors import InputError
from pddsim.sim import simulate
from pddsim.workload.model import TraceTable, Workload
from pddsim.workload.synthetic import poisson_workload

POLICIES = ("packed", "alone")      # the default first


@dataclass(frozen=True)
class Stream:
    """The fixed traffic every point replays. The defaults (the CLI's too) show the phenomenon on
    the bundled configs: 20K-token prompts at 20 req/s keep the prefill pool saturated from 0% hit
    to past 60%, so throughput there is the pool's capacity at that hit rate, while a prompt is
    short enough for some requests to meet the SLO at every hit rate (64K-token prompts, 8 s of
    prefill each on `same_dc_pd.yaml`, meet a 5 s TTFT at none below 40% hit: goodput 0)."""
    context_tokens: int = 20480
    output_tokens: int = 16
    rate_rps: float = 20.0
    requests: int = 200
    block_tokens: int = 64


def parse_hits(text: str) -> list[float]:
    """`START:STOP:STEP` (STOP included when the steps reach it) or a comma list, each in [0, 1]."""
    try:
        if ":" in text:
            start, stop, step = (float(x) for x in text.split(":"))
            if step <= 0:
                raise ValueError
            hits = list(np.round(np.arange(start, stop + step / 2, step), 6))
        else:
            hits = [float(x) for x in text.split(",")]
    except ValueError:
        raise InputError(f"--hits {text}: expected START:STOP:STEP or a comma list") from None
    if not hits or any(not 0 <= h <= 1 for h in hits):
        raise InputError(f"--hits {text}: hit rates must lie in [0, 1]")
    return hits


def shared_tokens(hit_rate: float, stream: Stream) -> int:
    """The shared prefix for a hit rate, in whole cache blocks, leaving at least one block to
    compute (a request always computes its last token)."""
    blocks = round(hit_rate * stream.context_tokens) // stream.block_tokens
    most = stream.context_tokens // stream.block_tokens - 1
    return min(blocks, most) * stream.block_tokens


def warmed(workload: Workload) -> Workload:
    """The same stream, started once its first request has finished: one session whose every
    other request follows the first by its Poisson offset (closed-loop replay lets a request
    follow only an earlier turn of its own session)."""
    first, *rest = workload.requests
    t0 = first.arrival_s
    return Workload(TraceTable.of([replace(first, arrival_s=0.0, session_id=0)]
                                  + [replace(r, arrival_s=r.arrival_s - t0, session_id=0,
                                             follows=0, think_s=r.arrival_s - t0) for r in rest]),
                    source=workload.source, extra=workload.extra)


def bathtub(cfg: Config, hits: list[float], stream: Stream = Stream(),
            policies: tuple[str, ...] = POLICIES, seed: int | None = None,
            on_point=None) -> list[dict]:
    """One point per policy and hit rate: goodput, throughput and TTFT P50 of the stream."""
    points = []
    for policy in policies:
        policy_cfg = cfg.model_copy(update={
            "batching": cfg.batching.model_copy(update={"chunk_packing": policy}),
            "workload": cfg.workload.model_copy(update={"replay": "closed",
                                                        "session_start": "recorded",
                                                        "time_scale": 1.0})})
        for hit in hits:
            shared = shared_tokens(hit, stream)
            workload = warmed(poisson_workload(
                stream.requests, stream.rate_rps, stream.context_tokens, stream.output_tokens,
                input_sigma=0.0, output_sigma=0.0, shared_prefix_tokens=shared,
                block_tokens=stream.block_tokens, seed=cfg.seed if seed is None else seed))
            s = simulate(policy_cfg, workload, seed).summary
            points.append({"policy": policy, "hit_rate": hit, "goodput_rps": s["goodput_rps"],
                           "throughput_rps": s["throughput_rps"], "ttft_p50_s": s["ttft_p50_s"],
                           "measured_hit_rate": s["prefix_hit_rate"],
                           "computed_tokens_per_s": s["throughput_rps"]
                           * (stream.context_tokens - shared)})
            if on_point is not None:
                on_point(1)
    return points


def plot(points: list[dict], path: str, title: str) -> None:
    """Requests per second (throughput and goodput) and computed prompt tokens per second, each
    against the hit rate, one line per policy."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(11, 3.8))
    FigureCanvasAgg(fig)
    rps, tokens = fig.subplots(1, 2)
    for policy in dict.fromkeys(p["policy"] for p in points):
        mine = [p for p in points if p["policy"] == policy]
        hits = [100 * p["hit_rate"] for p in mine]
        rps.plot(hits, [p["throughput_rps"] for p in mine], marker=".", label=f"{policy}: throughput")
        rps.plot(hits, [p["goodput_rps"] for p in mine], linestyle=":", label=f"{policy}: goodput")
        tokens.plot(hits, [p["computed_tokens_per_s"] for p in mine], marker=".", label=policy)
    rps.set_ylabel("requests/s")
    tokens.set_ylabel("uncached prompt tokens computed/s")
    for ax in (rps, tokens):
        ax.set_xlabel("prefix hit rate (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.savefig(path, dpi=110, bbox_inches="tight")
