"""Sweep: one scenario over the cartesian product of config values, one table row per point.

Capacity planning asks how the metrics move with instance counts, WAN sizes and policies. Every
point is validated before any runs, so a typo in the last point does not cost the others' runs; the
points replay one workload (the same traffic) unless the grid varies the workload itself; and they
run in worker processes, which changes nothing in the table: `simulate` has no globals and each row
is put back in grid order.
"""
from __future__ import annotations

import copy
import itertools
import json
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd
import yaml

from pddsim.config import Config, load_config
from pddsim.errors import InputError
from pddsim.experiments.backends import Failed, Processes
from pddsim.experiments.compare import ROWS, compare, format_cell
from pddsim.experiments.result_cache import ResultCache, workload_digest
from pddsim.sim import load_workload
from pddsim.system.deployment import check_fits
from pddsim.workload.model import Workload

# the metrics the printed table shows; the DataFrame, --json and --out keep the whole summary
HEADLINE = ("ttft_p50_s", "ttft_p90_s", "tpot_mean_s", "slo_attainment", "goodput_rps",
            "cost_per_hour", "bcr", "capacity_rps", "bcr_at_capacity")
WRITERS = {".csv": "to_csv", ".parquet": "to_parquet"}


def parse_axis(text: str, flag: str = "--grid") -> tuple[str, list]:
    """`KEY=V1,V2,...` -> (KEY, values), the values parsed as one YAML flow list."""
    key, sep, values = text.partition("=")
    try:
        parsed = yaml.safe_load(f"[{values}]") if sep and key.strip() else None
    except yaml.YAMLError:
        parsed = None
    if not parsed:
        raise InputError(f"{flag} {text}: expected KEY=V1,V2,... (values parsed as YAML)")
    return key.strip(), parsed


def grid_points(grids: list[str]) -> list[dict[str, Any]]:
    """`KEY=V1,V2,...` texts -> their cartesian product, the last grid varying fastest. The values
    are read as one YAML flow list without its brackets, so each parses as `--set` would parse it
    and a list, mapping or quoted value may hold commas (`--grid 'pdd.handoff=one_shot,catch_up'`,
    `--grid 'gpu_prices={h200: 4},{h200: 5}'`)."""
    axes: dict[str, list] = {}
    for text in grids:
        key, values = parse_axis(text)
        if key in axes:
            raise InputError(f"--grid {key}: given twice")
        axes[key] = values
    return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]


def point_label(point: dict[str, Any]) -> str:
    """A point of a grid or plan as its errors name it: `key=value, ...`."""
    return ", ".join(f"{key}={value}" for key, value in point.items())


def _point_config(base_path, overrides, point: dict[str, Any], n: int) -> Config:
    """The base config with `--set` overrides, then the point's values; validated including that
    the model fits its GPUs, with the point named in the error."""
    try:
        # a copy: points share value objects, and a nested grid key would write into them
        cfg = load_config(base_path, overrides, copy.deepcopy(point))
        check_fits(cfg)
    except InputError as e:
        raise InputError(f"grid point {n} ({point_label(point)}): {e}") from None
    return cfg


def _run_point(shared: tuple[Workload | None, bool, int | None], cfg: Config) -> dict:
    """One point's summary (module level: workers call it by name). With no shared workload the
    point builds its own, in the worker."""
    workload, capacity, seed = shared
    summary = compare([cfg], load_workload(cfg) if workload is None else workload,
                      seed=seed, capacity=capacity)[0]
    return json.loads(json.dumps(summary, default=float))   # plain values, as the cache keeps them


def sweep(base_path: str | Path, grids: list[str], overrides: Sequence[str] = (),
          capacity: bool = False, seed: int | None = None,
          on_progress: Callable[[int], None] | None = None, backend=None,
          cache: ResultCache | None = None) -> pd.DataFrame:
    """One row per grid point, in grid order: the grid keys' values, then the run's summary (with
    `capacity`, also `capacity_rps` and `bcr_at_capacity`); a point that failed for good has its
    reason under `failed`. `backend` runs the points (default: local processes, one per CPU);
    `cache` keeps finished points and reuses them; `on_progress(1)` as
    each point's row arrives.

    The workload is built once, from the base config, unless a grid key is under `workload`; so a
    grid over `seed` varies the run's randomness (WAN background, predictor), not the traffic (and
    only when no `seed` argument overrides every point's).
    """
    points = grid_points(grids)
    configs = [_point_config(base_path, overrides, p, n) for n, p in enumerate(points, 1)]
    per_point = any(key.split(".")[0] == "workload" for key in points[0])
    shared = None if per_point else load_workload(load_config(base_path, overrides))
    summaries: list = [None] * len(configs)
    keys = [""] * len(configs)
    if cache is not None:
        task = f"sweep-capacity={capacity}"
        digest = workload_digest(shared) if shared is not None else ""
        for i, cfg in enumerate(configs):
            run_seed = cfg.seed if seed is None else seed
            keys[i] = cache.key(task, cfg, digest or workload_digest(load_workload(cfg)), run_seed)
            summaries[i] = cache.get(keys[i])
            if summaries[i] is not None and on_progress is not None:
                on_progress(1)
    todo = [i for i, s in enumerate(summaries) if s is None]

    def done(j: int, value) -> None:
        if cache is not None and not isinstance(value, Failed):
            cache.put(keys[todo[j]], value)
        if on_progress is not None:
            on_progress(1)

    with Processes() if backend is None else nullcontext() as owned:
        results = (owned or backend).map(_run_point, [configs[i] for i in todo],
                                         (shared, capacity, seed), done)
    for i, value in zip(todo, results):
        summaries[i] = {"failed": value.reason} if isinstance(value, Failed) else value
    return pd.DataFrame([{**point, **summary} for point, summary in zip(points, summaries)])


def format_sweep(table: pd.DataFrame, grid_keys: list[str]) -> str:
    """The grid columns and the headline metrics, each shown as `pddsim compare` shows it."""
    formats = {key: fmt for key, _, fmt in ROWS}
    metrics = [key for key in HEADLINE if key in table]
    return table[[*grid_keys, *metrics]].to_string(
        index=False, formatters={key: partial(format_cell, formats[key], key) for key in metrics})


def table_writer(path: str | Path) -> Callable[[pd.DataFrame], None]:
    """How `--out` writes the table, chosen by its extension; asked for before the sweep runs, so
    a wrong extension costs no runs."""
    method = WRITERS.get(Path(path).suffix.lower())
    if method is None:
        raise InputError(f"--out {path}: expected a .csv or .parquet file")
    return lambda table: getattr(table, method)(path, index=False)
