"""Where PDD wins: PDD's capacity and BCR against a baseline (same-DC PD) over two factors, as maps
with the break-even line.

PDD's premise is that chip A suits prefill and chip B decode, and that the homogeneous baseline is
limited by decode on chip A; how far that holds depends on the factors below. Each grid point sets
both factors on both systems (a factor only one system has, such as the WAN, on that one), measures
each system's capacity (`find_capacity`, steady state when the configs have a horizon) and takes
PDD's capacity and BCR at capacity over the baseline's: above 1 PDD wins. Each system keeps the
split it is given (the CLI: the paper plan's; not re-planned per point: a point's ratio is at
fixed hardware). GPU B's price premium moves only PDD's cost, so the capacities it needs are
measured once per value of the other factor; so is any search two points share.

Hardware and model factors edit catalog entries, not config fields: GPU A's HBM is the first
cluster's GPU entry with another `hbm_gb`, the KV bytes per token the model's entry with another
`kv_bytes_per_token`, each written into the config's own `catalog:` (the KV pool follows, as it is
derived from both). Every point is validated (the model fits, with room for KV) before any search
runs. The searches are independent: a backend runs them, results in grid order whatever the number
of workers, and a cache keeps each finished one.
"""
from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from pddsim import catalog
from pddsim.config import Config, load_config
from pddsim.cost import cost_per_hour, gpu_price
from pddsim.errors import InputError
from pddsim.experiments.backends import Failed, Processes
from pddsim.experiments.capacity import distinguishable, find_capacity
from pddsim.experiments.result_cache import ResultCache, workload_digest
from pddsim.experiments.sweep import parse_axis, point_label
from pddsim.sim import load_workload
from pddsim.system.deployment import check_fits

TASK = "map-capacity"       # what a cached result measured
# a factor that edits catalog entries: given the config as the other factors leave it, its own
# catalog as a `catalog:` tree (edited in place) and the factor's value, the other config values
# it needs set
Edit = Callable[[Config, dict, Any], dict[str, Any]]


@dataclass(frozen=True)
class Factor:
    help: str
    path: str | None = None     # the config path set on each system that has it
    pdd_only: bool = False
    edit: Edit | None = None    # or: the catalog entries it changes


def _put(tree: dict, kind: str, name: str, spec: Any, **changes: Any) -> None:
    """`spec`'s fields with `changes` as the entry `name` of `tree`, shadowing a bundled one."""
    fields = spec.model_dump(mode="json", exclude={"name", "source", "override"})
    tree[kind][name] = {**fields, **changes, "override": name in catalog.BUNDLED.known(kind)}


def _gpu_a_hbm(cfg: Config, tree: dict, hbm: Any) -> dict[str, Any]:
    """GPU A (the first cluster's GPU) with `hbm` GB: its entry changed under its own name, or a
    copy under a derived name (at the original's price) when another cluster runs the same GPU,
    which keeps its HBM."""
    (cname, cluster), *_ = cfg.clusters.items()
    gpu = cluster.gpu
    shared = sum(c.gpu == gpu for c in cfg.clusters.values()) > 1
    name = f"{gpu}-{hbm}gb" if shared else gpu
    _put(tree, "gpus", name, cfg.catalog.gpu(gpu), hbm_gb=hbm)
    values: dict[str, Any] = {f"clusters.{cname}.gpu": name}
    if shared and gpu in cfg.gpu_prices:
        values["gpu_prices"] = {**cfg.gpu_prices, name: cfg.gpu_prices[gpu]}
    return values


def _kv_bytes(cfg: Config, tree: dict, value: Any) -> dict[str, Any]:
    """The model with `value` KV bytes per token (in its catalog KV dtype: `quant.kv` scales it)."""
    _put(tree, "models", cfg.model, cfg.catalog.model(cfg.model), kv_bytes_per_token=value)
    return {}


FACTORS = {
    "gpu_b_premium": Factor("GPU B's price over GPU A's, as a fraction (0.3: 30% dearer)",
                            pdd_only=True),
    "gpu_a_hbm_gb": Factor("GPU A's HBM, GB (the first cluster's GPU; its KV pool follows)",
                           edit=_gpu_a_hbm),
    "model": Factor("the model, by catalog name", "model"),
    "kv_bytes_per_token": Factor("the model's KV bytes per token (in its catalog KV dtype)",
                                 edit=_kv_bytes),
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


def point_config(path: str | Path, overrides: Sequence[str], factors: dict[str, Any],
                 is_pdd: bool) -> Config:
    """`path` with `overrides`, then the factors this system has: config fields first, then the
    catalog edits, made on the config those leave."""
    mine = {n: v for n, v in factors.items() if is_pdd or not FACTORS[n].pdd_only}
    values: dict[str, Any] = {field: v for n, v in mine.items()
                              if (field := FACTORS[n].path) is not None}
    cfg = load_config(path, overrides, values)
    edits = [(edit, v) for n, v in mine.items() if (edit := FACTORS[n].edit) is not None]
    if not edits:
        return cfg
    tree = {kind: {name: entry.model_dump(mode="json", exclude={"name"})
                   for name, entry in entries.items()}
            for kind, entries in cfg.catalog.sections().items()}
    for edit, v in edits:
        values.update(edit(cfg, tree, v))
    return load_config(path, overrides, {**values, "catalog": tree})


def _priced(cfg: Config, premium: Any) -> Config:
    """`cfg` with its non-first clusters' GPUs priced `premium` over its first cluster's GPU."""
    if premium is None:
        return cfg
    if isinstance(premium, bool) or not isinstance(premium, (int, float)) or premium <= -1:
        raise InputError(f"gpu_b_premium={premium}: expected a number above -1 (0.3: 30% dearer)")
    first, *rest = cfg.clusters.values()
    base = gpu_price(cfg, first.gpu)
    prices = {**cfg.gpu_prices, **{c.gpu: base * (1 + premium) for c in rest}}
    return cfg.model_copy(update={"gpu_prices": prices})


def _search(seed: int | None, cfg: Config) -> dict:
    """One system's capacity search at one point (module level: workers call it by name), as the
    plain values the map and the cache keep."""
    cap = find_capacity(cfg, load_workload(cfg), seed=seed)
    return json.loads(json.dumps({"capacity_rps": cap.capacity_rps, "interval": cap.interval,
                                  "goodput_rps": cap.goodput_rps, "bcr": cap.bcr,
                                  "status": cap.status}, default=float))


def _failed(value: Any) -> dict:
    if not isinstance(value, Failed):
        return value
    return {"capacity_rps": None, "interval": None, "goodput_rps": None, "bcr": None,
            "status": f"failed ({value.reason})"}


def _row(x: Any, y: Any, b: dict, p: dict, pdd_cost: float) -> dict:
    pdd_bcr = None if p["goodput_rps"] is None else p["goodput_rps"] * 3600.0 / pdd_cost
    return {"x": x, "y": y,
            "baseline_capacity_rps": b["capacity_rps"], "pdd_capacity_rps": p["capacity_rps"],
            "capacity_ratio": _ratio(p["capacity_rps"], b["capacity_rps"]),
            "capacity_apart": distinguishable(b["interval"], p["interval"]),
            "baseline_bcr": b["bcr"], "pdd_bcr": pdd_bcr, "bcr_ratio": _ratio(pdd_bcr, b["bcr"]),
            "baseline_status": b["status"], "pdd_status": p["status"]}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def pdd_map(baseline: str | Path, pdd: str | Path, x: tuple[str, list], y: tuple[str, list],
            overrides: Sequence[str] = (), *, own: tuple[Sequence[str], Sequence[str]] = ((), ()),
            seed: int | None = None, backend=None,
            cache: ResultCache | None = None,
            on_progress: Callable[[int], None] | None = None) -> list[dict]:
    """One row per (x, y) grid point (x varying fastest): both systems' capacities and BCRs and
    PDD's ratios. `own`: the baseline's and PDD's own overrides (their splits), before
    `overrides`. `backend` (default: local processes, one per CPU) runs the distinct searches,
    `cache` keeps and reuses them; `on_progress(1)` as each search is known."""
    (xn, xs), (yn, ys) = x, y
    if xn == yn:
        raise InputError(f"map: --x and --y are the same factor ({xn})")
    points = [{xn: xv, yn: yv} for yv in ys for xv in xs]
    searches: dict[str, Config] = {}          # distinct configs to search, by content
    layout: list[tuple[str, str, float]] = []    # per point: baseline's and PDD's keys, PDD's cost
    for factors in points:
        keys = []
        cost = 0.0
        for path, is_pdd, sets in ((baseline, False, own[0]), (pdd, True, own[1])):
            try:
                cfg = point_config(path, [*sets, *overrides], factors, is_pdd)
                check_fits(cfg)
                if is_pdd:
                    cost = cost_per_hour(_priced(cfg, factors.get("gpu_b_premium")))
            except InputError as e:
                system = "PDD" if is_pdd else "baseline"
                raise InputError(f"map point {point_label(factors)}, {system}: {e}") from None
            key = json.dumps(cfg.model_dump(mode="json"), sort_keys=True)
            searches.setdefault(key, cfg)
            keys.append(key)
        layout.append((keys[0], keys[1], cost))
    found = _run_searches(searches, seed, backend, cache, on_progress)
    return [_row(f[xn], f[yn], found[b], found[p], cost)
            for f, (b, p, cost) in zip(points, layout)]


def _run_searches(searches: dict[str, Config], seed: int | None, backend,
                  cache: ResultCache | None, on_progress: Callable[[int], None] | None) -> dict:
    """Each distinct search's result by key: from the cache, or run on the backend."""
    progress = on_progress or (lambda n: None)
    found: dict[str, dict] = {}
    cache_keys: dict[str, str] = {}
    if cache is not None:
        digests: dict[str, str] = {}
        for key, cfg in searches.items():
            wkey = json.dumps([cfg.workload.model_dump(mode="json"), cfg.base_dir, cfg.seed])
            if wkey not in digests:
                digests[wkey] = workload_digest(load_workload(cfg))
            cache_keys[key] = cache.key(TASK, cfg, digests[wkey], cfg.seed if seed is None else seed)
            hit = cache.get(cache_keys[key])
            if hit is not None:
                found[key] = hit
                progress(1)
    todo = [key for key in searches if key not in found]

    def done(j: int, value: Any) -> None:
        if cache is not None and not isinstance(value, Failed):
            cache.put(cache_keys[todo[j]], value)
        progress(1)

    with Processes() if backend is None else nullcontext() as owned:
        values = (owned or backend).map(_search, [searches[k] for k in todo], seed, done)
    found.update((key, _failed(value)) for key, value in zip(todo, values))
    return found


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
