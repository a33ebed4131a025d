"""Where PDD wins: PDD's capacity and BCR against a baseline (same-DC PD) over two factors, as maps
with the break-even line.

PDD's premise is that chip A suits prefill and chip B decode, and that the homogeneous baseline is
limited by decode on chip A; how far that holds depends on the factors below. Each grid point sets
both factors on both systems (a factor only one system has, such as the WAN, on that one), measures
each system's capacity (`find_capacity`, steady state when the configs have a horizon) at its best
split for its cost and takes PDD's capacity and BCR at capacity over the baseline's: above 1 PDD
wins.

The best split is found per point and system by a local search from the split it is given (the
CLI: the paper plan's): a neighbour moves one instance between two pools of one datacenter on the
same GPU with as many GPUs an instance (`plan.neighbour_splits`: same-DC PD's P <-> D, PDD's P <->
RLD; its MDs stay), so every split tried costs the same and is ranked by its capacity. A round
measures every neighbour of the current split not yet measured (its search started at the current
split's capacity load), one that is not a deployment (a pool emptied, the model does not fit)
skipped; the climb moves to the best neighbour (the first in move order on a tie) when its
capacity beats the current one's and stops when none does: a local optimum, not a plan's global
one. A split without a capacity (never saturated, never stationary) is never moved to, and as the
given split it is where the climb stops; a search that failed on the backend fails the climb (its
status says why). `fixed_split` measures the given splits only (a point's ratio is then at fixed
hardware). Every climb's round
runs at once on the backend; the climb is a function of its start and the searches' results, so
the map does not depend on the number of workers. GPU B's price premium moves only PDD's cost, so
the climbs it needs run once per value of the other factor; so does any climb two points share,
and any search two climbs share.

Hardware and model factors edit catalog entries, not config fields: GPU A's HBM is the first
cluster's GPU entry with another `hbm_gb`, the KV bytes per token the model's entry with another
`kv_bytes_per_token`, each written into the config's own `catalog:` (the KV pool follows, as it is
derived from both). Every point is validated (the model fits, with room for KV) before any search
runs. A cache keeps each finished search under its config, workload, seed and start load.
"""
from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from pddsim import catalog
from pddsim.config import Config, load_config
from pddsim.cost import cost_per_hour, gpu_price
from pddsim.errors import InputError
from pddsim.experiments.backends import Failed, Processes
from pddsim.experiments.capacity import distinguishable, find_capacity
from pddsim.experiments.plan import neighbour_splits, split_of
from pddsim.experiments.result_cache import ResultCache, workload_digest
from pddsim.experiments.sweep import parse_axis, point_label
from pddsim.sim import load_workload
from pddsim.system.deployment import check_fits

TASK = "map-search"         # what a cached result measured: one split's capacity search
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
                 is_pdd: bool, split: dict[str, int] | None = None) -> Config:
    """`path` with `overrides`, then the factors this system has and `split` (instance counts by
    config path, as `plan.split_of` gives them): config fields first, then the catalog edits,
    made on the config those leave."""
    mine = {n: v for n, v in factors.items() if is_pdd or not FACTORS[n].pdd_only}
    values: dict[str, Any] = {field: v for n, v in mine.items()
                              if (field := FACTORS[n].path) is not None}
    values.update(split or {})
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


def _search(seed: int | None, task: tuple[Config, float | None]) -> dict:
    """One capacity search of one split at one point, started at the doubling nearest `start`
    when given (module level: workers call it by name), as the plain values the map and the
    cache keep."""
    cfg, start = task
    cap = find_capacity(cfg, load_workload(cfg), seed=seed, start=start)
    return json.loads(json.dumps({"capacity_rps": cap.capacity_rps, "interval": cap.interval,
                                  "goodput_rps": cap.goodput_rps, "bcr": cap.bcr,
                                  "status": cap.status,
                                  "capacity_load": cap.load if cap.found else None}, default=float))


def _failed(value: Any) -> dict:
    if not isinstance(value, Failed):
        return value
    return {"capacity_rps": None, "interval": None, "goodput_rps": None, "bcr": None,
            "status": f"failed ({value.reason})", "capacity_load": None}


def _row(x: Any, y: Any, b: _Climb, p: _Climb, pdd_cost: float) -> dict:
    bs, ps = b.result, p.result
    pdd_bcr = None if ps["goodput_rps"] is None else ps["goodput_rps"] * 3600.0 / pdd_cost
    return {"x": x, "y": y,
            "baseline_capacity_rps": bs["capacity_rps"], "pdd_capacity_rps": ps["capacity_rps"],
            "capacity_ratio": _ratio(ps["capacity_rps"], bs["capacity_rps"]),
            "capacity_apart": distinguishable(bs["interval"], ps["interval"]),
            "baseline_bcr": bs["bcr"], "pdd_bcr": pdd_bcr, "bcr_ratio": _ratio(pdd_bcr, bs["bcr"]),
            "baseline_status": bs["status"], "pdd_status": ps["status"],
            "baseline_split": dict(b.split), "pdd_split": dict(p.split),
            "baseline_tried": b.tried, "pdd_tried": p.tried}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _key(cfg: Config) -> str:
    return json.dumps(cfg.model_dump(mode="json"), sort_keys=True)


# a search: its config's content and the load it starts from (None: the configured one)
Search = tuple[str, float | None]


class _Climb:
    """One system's local split search from one point's config: measure the current split's
    same-cost neighbours (`plan.neighbour_splits`; one that is not a deployment is skipped), each
    search started at the current split's capacity load; move to the best (by capacity, the first
    in move order on a tie) if its capacity beats the current one's; stop when none does. A split
    is measured once per climb; `fixed` measures the given split only."""

    def __init__(self, cfg: Config, make: Callable[[dict[str, int]], Config], fixed: bool):
        self.make, self.fixed = make, fixed
        self.split = split_of(cfg)
        self.configs: dict[str, Config | None] = {_split_key(self.split): cfg}   # None: skipped
        self.searches: dict[str, Search] = {_split_key(self.split): (_key(cfg), None)}
        self.result: dict = {}
        self.done = False

    @property
    def tried(self) -> int:
        """Splits measured."""
        return len(self.searches)

    def wanted(self) -> list[tuple[Search, Config]]:
        """Every search this climb has asked for, with its config."""
        return [(search, cfg) for k, search in self.searches.items()
                if (cfg := self.configs[k]) is not None]

    def advance(self, found: dict[Search, dict], failures: set[Search]) -> None:
        """Move on, given every search this climb asked for (`failures`: those that failed on the
        backend: the climb stops there, failed); ask for the next round's or stop."""
        while True:
            mine = self.searches[_split_key(self.split)]
            here = found[mine]
            failed = next((found[s] for s in self.searches.values() if s in failures), None)
            if failed is not None or self.fixed or here["capacity_rps"] is None:
                self.result, self.done = failed or here, True
                return
            near = []
            for split in neighbour_splits(self.final):
                k = _split_key(split)
                if k not in self.configs:
                    cfg: Config | None = None
                    try:
                        made = self.make(split)
                        check_fits(made)
                        cfg = made
                    except InputError:
                        pass
                    self.configs[k] = cfg
                    if cfg is not None:
                        self.searches[k] = (_key(cfg), here["capacity_load"])
                if self.configs[k] is not None:
                    near.append((split, self.searches[k]))
            if any(s not in found for _, s in near):
                return
            best = max(near, key=lambda n: found[n[1]]["capacity_rps"] or -1.0, default=None)
            if best is None or (found[best[1]]["capacity_rps"] or -1.0) <= here["capacity_rps"]:
                self.result, self.done = here, True
                return
            self.split = best[0]

    @property
    def final(self) -> Config:
        """The config at the split the climb ended on."""
        cfg = self.configs[_split_key(self.split)]
        assert cfg is not None                  # the climb only stands on deployments
        return cfg


def _split_key(split: dict[str, int]) -> str:
    return json.dumps(split)


def pdd_map(baseline: str | Path, pdd: str | Path, x: tuple[str, list], y: tuple[str, list],
            overrides: Sequence[str] = (), *, own: tuple[Sequence[str], Sequence[str]] = ((), ()),
            fixed_split: bool = False, seed: int | None = None, backend=None,
            cache: ResultCache | None = None,
            on_progress: Callable[[int], None] | None = None) -> list[dict]:
    """One row per (x, y) grid point (x varying fastest): both systems' capacities and BCRs at
    their best splits for their cost (a local search from the split each is given, `_Climb`;
    `fixed_split`: at the given splits), PDD's ratios and the splits. `own`: the baseline's and
    PDD's own overrides (their splits), before `overrides`. `backend` (default: local processes,
    one per CPU) runs each round of the distinct searches, `cache` keeps and reuses them;
    `on_progress(1)` as each search is known."""
    (xn, xs), (yn, ys) = x, y
    if xn == yn:
        raise InputError(f"map: --x and --y are the same factor ({xn})")
    points = [{xn: xv, yn: yv} for yv in ys for xv in xs]
    climbs: dict[str, _Climb] = {}            # distinct climbs, by their start's content
    layout: list[tuple[str, str]] = []        # per point: the baseline's and PDD's climbs
    for factors in points:
        keys = []
        for path, is_pdd, sets in ((baseline, False, own[0]), (pdd, True, own[1])):
            try:
                cfg = point_config(path, [*sets, *overrides], factors, is_pdd)
                check_fits(cfg)
                if is_pdd:
                    _priced(cfg, factors.get("gpu_b_premium"))
            except InputError as e:
                system = "PDD" if is_pdd else "baseline"
                raise InputError(f"map point {point_label(factors)}, {system}: {e}") from None
            key = _key(cfg)
            if key not in climbs:
                make = partial(point_config, path, [*sets, *overrides], factors, is_pdd)
                climbs[key] = _Climb(cfg, make, fixed_split)
            keys.append(key)
        layout.append((keys[0], keys[1]))
    runner = _Searches(seed, cache, on_progress)
    with Processes() if backend is None else nullcontext() as owned:
        while active := [c for c in climbs.values() if not c.done]:
            runner.run([w for c in active for w in c.wanted()], owned or backend)
            for c in active:
                c.advance(runner.found, runner.failures)
    rows = []
    for f, (b, p) in zip(points, layout):
        pdd_cost = cost_per_hour(_priced(climbs[p].final, f.get("gpu_b_premium")))
        rows.append(_row(f[xn], f[yn], climbs[b], climbs[p], pdd_cost))
    return rows


class _Searches:
    """Every search the climbs asked for, by (config content, start): from the cache, or run a
    round at a time on a backend, each distinct one once."""

    def __init__(self, seed: int | None, cache: ResultCache | None,
                 on_progress: Callable[[int], None] | None):
        self.seed, self.cache = seed, cache
        self.progress = on_progress or (lambda n: None)
        self.found: dict[Search, dict] = {}
        self.failures: set[Search] = set()
        self.digests: dict[str, str] = {}        # workload -> its digest

    def cache_key(self, cfg: Config, start: float | None) -> str:
        assert self.cache is not None
        wkey = json.dumps([cfg.workload.model_dump(mode="json"), cfg.base_dir, cfg.seed])
        if wkey not in self.digests:
            self.digests[wkey] = workload_digest(load_workload(cfg))
        task = TASK if start is None else f"{TASK} from {start!r}"
        return self.cache.key(task, cfg, self.digests[wkey],
                              cfg.seed if self.seed is None else self.seed)

    def run(self, wanted: list[tuple[Search, Config]], backend) -> None:
        todo: dict[Search, tuple[Config, str | None]] = {}
        for search, cfg in wanted:
            if search in self.found or search in todo:
                continue
            key = self.cache_key(cfg, search[1]) if self.cache is not None else None
            hit = self.cache.get(key) if self.cache is not None and key is not None else None
            if hit is not None:
                self.found[search] = hit
                self.progress(1)
            else:
                todo[search] = (cfg, key)
        order = list(todo)

        def done(j: int, value: Any) -> None:
            key = todo[order[j]][1]
            if key is not None and self.cache is not None and not isinstance(value, Failed):
                self.cache.put(key, value)
            self.progress(1)

        values = backend.map(_search, [(todo[s][0], s[1]) for s in order], self.seed, done)
        for s, value in zip(order, values):
            self.found[s] = _failed(value)
            if isinstance(value, Failed):
                self.failures.add(s)


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
    """Both ratio tables, then the splits measured (each system's counts in config order)."""
    import pandas as pd
    frame = pd.DataFrame(rows)
    parts = []
    for key, label in (("capacity_ratio", "PDD capacity / baseline"), ("bcr_ratio",
                                                                          "PDD BCR / baseline")):
        table = frame.pivot(index="y", columns="x", values=key)
        parts.append(f"{label} (rows: {y}, columns: {x}; above 1: PDD wins)\n"
                     + table.to_string(float_format=lambda v: f"{v:.2f}"))
    frame["splits"] = [f"{_compact(r['baseline_split'])} | {_compact(r['pdd_split'])}"
                       for r in rows]
    paths = [", ".join(rows[0][f"{s}_split"]) for s in ("baseline", "pdd")] if rows else ["", ""]
    parts.append(f"splits (baseline | PDD: the counts of {paths[0]} | of {paths[1]})\n"
                 + frame.pivot(index="y", columns="x", values="splits").to_string())
    return "\n\n".join(parts)


def _compact(split: dict[str, int]) -> str:
    return "+".join(str(n) for n in split.values())
