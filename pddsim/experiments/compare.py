"""Several systems on the same workload, side by side, with deltas against the first."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from pddsim.config import Config
from pddsim.experiments.capacity import find_capacity
from pddsim.sim import simulate
from pddsim.workload.model import Workload

# (summary key, label, how to show it)
ROWS = [
    ("ttft_p50_s", "TTFT P50 s", "{:.3f}"),
    ("ttft_p90_s", "TTFT P90 s", "{:.3f}"),
    ("ttft_p99_s", "TTFT P99 s", "{:.3f}"),
    ("ttft_mean_s", "TTFT mean s", "{:.3f}"),
    ("tpot_mean_s", "TPOT mean s", "{:.4f}"),
    ("itl_max_p99_s", "max ITL P99 s", "{:.3f}"),
    ("slo_attainment", "SLO attainment", "{:.1%}"),
    ("goodput_rps", "goodput rps", "{:.3f}"),
    ("capacity_rps", "capacity rps", "{:.3f}"),
    ("capacity_lower_bound_rps", "capacity not found, >= rps", "{:.3f}"),
    ("bcr_at_capacity", "BCR at capacity", "{:.2f}"),
    ("cost_per_hour", "cost $/h", "{:.1f}"),
    ("bcr", "BCR req/$", "{:.2f}"),
    ("revenue_per_hour", "revenue $/h", "{:.1f}"),
    ("margin_per_hour", "margin $/h", "{:.1f}"),
    ("cached_input_share", "cached input share", "{:.1%}"),
    ("rld_token_share", "RLD token share", "{:.1%}"),
    ("wan_bytes", "WAN GB", "{:.0f}"),
    ("prefix_hit_rate", "hit rate P", "{:.1%}"),
    ("prefix_hit_rate_md", "hit rate MD", "{:.1%}"),
]


def compare(configs: list[Config], workload: Workload, *, seed: int | None = None,
            capacity: bool = False, on_progress=None, out_dir: str | Path | None = None) -> list[dict]:
    """One summary per system at the workload's load; with `capacity`, each also gets the highest
    achieved rate at which it meets its SLO target (`capacity_rps`) and its BCR there (None when
    the search never broke the SLO; `capacity_lower_bound_rps` then says how far it went).
    `out_dir`: each system's run at the workload's load is written to a subfolder (`pddsim report`
    reads them as one comparison)."""
    summaries = []
    for i, cfg in enumerate(configs):
        result = simulate(cfg, workload, seed, on_progress=on_progress)
        if out_dir is not None:
            result.write(Path(out_dir) / f"{i + 1}-{cfg.name}")
        summary = result.summary
        if capacity:
            cap = find_capacity(cfg, workload, seed=seed, on_progress=on_progress)
            summary["capacity_rps"] = cap.capacity_rps
            summary["bcr_at_capacity"] = cap.result.summary["bcr"] if cap.found else None
            if not cap.found:
                summary["capacity_lower_bound_rps"] = cap.lower_bound_rps
        summaries.append(summary)
    return summaries


def format_cell(fmt: str, key: str, value) -> str:
    if value is None:
        return "-"
    return fmt.format(value / 1e9 if key == "wan_bytes" else value)


def format_comparison(summaries: list[dict]) -> str:
    """Metrics down, systems across; each system after the first also shows its relative delta."""
    base = summaries[0]
    rows = {}
    for key, label, fmt in ROWS:
        if all(key not in s for s in summaries):
            continue
        cells = []
        for i, s in enumerate(summaries):
            cell = format_cell(fmt, key, s.get(key))
            b, v = base.get(key), s.get(key)
            if i and b and v is not None:
                cell += f" ({(v / b - 1):+.0%})"
            cells.append(cell)
        rows[label] = cells
    return pd.DataFrame.from_dict(rows, orient="index",
                                  columns=[s["system"] for s in summaries]).to_string()
