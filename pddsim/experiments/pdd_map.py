"""Where PDD wins: PDD's capacity and BCR against a baseline (same-DC PD) over two factors, as maps
with the break-even line.

PDD's premise is that chip A suits prefill and chip B decode, and that the homogeneous baseline is
limited by decode on chip A; how far that holds depends on the factors below. Each grid point sets
both factors on both systems (a factor only one system has, such as the WAN, on that one), measures
each system's capacity (`find_capacity`, steady state when the configs have a horizon) and takes
PDD's capacity and BCR at capacity over the baseline's: above 1 PDD wins. Each system keeps its
configured split (not re-planned per point: a point's ratio is at fixed hardware). GPU B's price
premium moves only PDD's cost, so the capacities it needs are measured once per value of the
other factor.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from pddsim.config import Config, load_config
from pddsim.cost import cost_per_hour, gpu_price
from pddsim.errors import InputError
from pddsim.experiments.capacity import Capacity, distinguishable, find_capacity
from pddsim.experiments.sweep import parse_axis
from pddsim.sim import load_workload


@dataclass(frozen=True)
class Factor:
    help: str
    path: str | None            # the config path set on each system that has it
    pdd_only: bool = False


FACTORS = {
    "gpu_b_premium": Factor("GPU B's price over GPU A's, as a fraction (0.3: 30% dearer)", None,
                            pdd_only=True),
    "output_mean": Factor("mean output tokens per call", "workload.synthetic.knobs.output_mean"),
    "tpot_slo_s": Factor("the TPOT SLO, seconds", "slo.tpot_s"),
    "max_batch": Factor("the batch cap (running requests per instance)", "batching.max_batch"),
    "kv_dtype": Factor("the KV cache dtype (bytes per token: fp8 halves bf16)", "quant.kv"),
    "wan_gbps": Factor("the WAN's bandwidth, Gbps", "wan.bandwidth_gbps", pdd_only=True),
    "long_prob": Factor("hit-rate skew: the per-turn probability of a long, uncached tool output",
                        "workload.synthetic.knobs.long_prob"),
    "context_mean": Factor("mean task context tokens of a session's first call",
                           "workload.synthetic.knobs.context_mean"),
}


def parse_factor(text: str, flag: str) -> tuple[str, list]:
    """`NAME=V1,V2,...` with NAME one of FACTORS."""
    name, values = parse_axis(text, flag)
    if name not in FACTORS:
        raise InputError(f"{flag} {text}: unknown factor {name!r}; one of {', '.join(FACTORS)}")
    return name, values


def _overrides(cfg_is_pdd: bool, factors: dict[str, object]) -> list[str]:
    return [f"{FACTORS[n].path}={v}" for n, v in factors.items()
            if FACTORS[n].path is not None and (cfg_is_pdd or not FACTORS[n].pdd_only)]


def _priced(cfg: Config, premium: object) -> Config:
    """`cfg` with its non-first clusters' GPUs priced `premium` over its first cluster's GPU."""
    if premium is None:
        return cfg
    first, *rest = cfg.clusters.values()
    base = gpu_price(cfg, first.gpu)
    prices = {**cfg.gpu_prices, **{c.gpu: base * (1 + float(str(premium))) for c in rest}}
    return cfg.model_copy(update={"gpu_prices": prices})


@dataclass
class MapPoint:
    x: object
    y: object
    baseline: Capacity
    pdd: Capacity
    pdd_cost: float

    def row(self) -> dict:
        b, p = self.baseline, self.pdd
        pdd_bcr = None if p.goodput_rps is None else p.goodput_rps * 3600.0 / self.pdd_cost
        return {"x": self.x, "y": self.y,
                "baseline_capacity_rps": b.capacity_rps, "pdd_capacity_rps": p.capacity_rps,
                "capacity_ratio": _ratio(p.capacity_rps, b.capacity_rps),
                "capacity_apart": distinguishable(b.interval, p.interval),
                "baseline_bcr": b.bcr, "pdd_bcr": pdd_bcr, "bcr_ratio": _ratio(pdd_bcr, b.bcr),
                "baseline_status": b.status, "pdd_status": p.status}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def pdd_map(baseline: Path, pdd: Path, x: tuple[str, list], y: tuple[str, list],
            overrides: list[str] | None = None, *, seed: int | None = None,
            on_progress: Callable[[int], None] | None = None) -> list[dict]:
    """One row per (x, y) grid point: both systems' capacities and BCRs and PDD's ratios."""
    (xn, xs), (yn, ys) = x, y
    if xn == yn:
        raise InputError(f"map: --x and --y are the same factor ({xn})")
    measured: dict[tuple, Capacity] = {}

    def capacity(path: Path, is_pdd: bool, factors: dict) -> Capacity:
        sets = (overrides or []) + _overrides(is_pdd, factors)
        key = (str(path), tuple(sets))
        if key not in measured:
            cfg = load_config(path, sets)
            measured[key] = find_capacity(cfg, load_workload(cfg), seed=seed,
                                          on_progress=on_progress)
        return measured[key]

    rows = []
    for yv in ys:
        for xv in xs:
            factors = {xn: xv, yn: yv}
            base = capacity(baseline, False, factors)
            ours = capacity(pdd, True, factors)
            priced = _priced(load_config(pdd, (overrides or []) + _overrides(True, factors)),
                             factors.get("gpu_b_premium"))
            rows.append(MapPoint(xv, yv, base, ours, cost_per_hour(priced)).row())
    return rows


def plot_map(rows: list[dict], x: str, y: str, path: str | Path) -> None:
    """PDD's capacity and BCR ratios over the grid, each with its break-even contour (ratio 1)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    xs = list(dict.fromkeys(r["x"] for r in rows))
    ys = list(dict.fromkeys(r["y"] for r in rows))
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    for ax, key, title in zip(fig.subplots(1, 2), ("capacity_ratio", "bcr_ratio"),
                              ("capacity", "BCR")):
        grid = np.array([[next((r[key] for r in rows if r["x"] == xv and r["y"] == yv), None)
                          for xv in xs] for yv in ys], dtype=float)
        mesh = ax.imshow(grid, origin="lower", cmap="RdBu", vmin=0, vmax=2, aspect="auto")
        if np.isfinite(grid).sum() >= 4 and len(xs) > 1 and len(ys) > 1:
            ax.contour(np.arange(len(xs)), np.arange(len(ys)), grid, levels=[1.0], colors="k")
        for (i, j), v in np.ndenumerate(grid):
            ax.text(j, i, "-" if np.isnan(v) else f"{v:.2f}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(xs)), [str(v) for v in xs])
        ax.set_yticks(range(len(ys)), [str(v) for v in ys])
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.set_title(f"PDD {title} / baseline (black: break-even)")
        fig.colorbar(mesh, ax=ax)
    fig.savefig(path)


def format_map(rows: list[dict], x: str, y: str) -> str:
    import pandas as pd
    parts = []
    for key, label in (("capacity_ratio", "PDD capacity / baseline"), ("bcr_ratio",
                                                                          "PDD BCR / baseline")):
        table = pd.DataFrame(rows).pivot(index="y", columns="x", values=key)
        parts.append(f"{label} (rows: {y}, columns: {x}; above 1: PDD wins)\n"
                     + table.to_string(float_format=lambda v: f"{v:.2f}"))
    return "\n\n".join(parts)
