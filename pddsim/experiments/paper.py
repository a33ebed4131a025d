"""The PDD paper's published figures (PDD.md) and how each is derived from our three runs, so
`pddsim compare` can print them side by side and say which match within tolerance: relative, 30%
of the paper's value for shares and ratios (so 2.3% against 6.2% is no match), 15% for seconds.

Each figure says whether it is *fitted* (a config value was chosen to reproduce it, so matching it
is no evidence for the model) or *predicted* (it emerges from the mechanisms)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd
from pydantic import PositiveFloat, PositiveInt

from pddsim.config import Config, bundled, load_config
from pddsim.cost import cost_per_hour
from pddsim.errors import InputError
from pddsim.schema import Strict, load_model

PAPER_CONFIGS = [bundled(f"paper/{name}.yaml") for name in ("same_dc_pd", "cross_dc_pd", "pdd")]
PLANNED_SPLITS = bundled("plans/paper.yaml")


class PlannedSplits(Strict):
    """Each paper system's best split within one budget, as `compare --best-split` found it (a
    plan of the paper scenario takes minutes; its answer ships so the default comparison is fair
    and fast): config file name -> instance counts by dotted path."""
    budget_per_hour: PositiveFloat
    splits: dict[str, dict[str, PositiveInt]]


def planned_configs(overrides: Sequence[str] = (), path: Path = PLANNED_SPLITS
                    ) -> tuple[list[Config], float]:
    """The paper systems at their planned splits (then `overrides`), and the budget they were
    planned within. A planned split over that budget, or a system the plan lacks, is an input
    error naming the file."""
    planned = load_model(PlannedSplits, path, "planned splits")
    configs = []
    for config_path in PAPER_CONFIGS:
        counts = planned_counts(config_path, path)
        cfg = load_config(config_path, counts)
        if cost_per_hour(cfg) > planned.budget_per_hour * (1 + 1e-9):
            raise InputError(f"{path}: splits.{config_path.name} costs ${cost_per_hour(cfg):g}/h, "
                             f"over the budget of ${planned.budget_per_hour:g}/h")
        if overrides:                         # after the planned counts: a count set here wins
            cfg = load_config(config_path, counts + list(overrides))
        configs.append(cfg)
    return configs, planned.budget_per_hour


def planned_counts(config_path: Path, path: Path = PLANNED_SPLITS) -> list[str]:
    """A paper system's planned instance counts, as overrides (`path=count`)."""
    values = load_model(PlannedSplits, path, "planned splits").splits.get(config_path.name)
    if values is None:
        raise InputError(f"{path}: splits: no split for {config_path.name}")
    return [f"{k}={v}" for k, v in values.items()]


FITTED, PREDICTED = "fitted", "predicted"


@dataclass(frozen=True)
class Figure:
    label: str
    paper: float
    ours: Callable[[dict, dict, dict], float | None]   # (same-DC, naive cross-DC, PDD) summaries
    percent: bool                                       # a share or a ratio, else seconds
    basis: str                                          # FITTED or PREDICTED
    why: str                                            # what was fitted to it, or what it tests

    @property
    def tolerance(self) -> float:
        return 0.30 if self.percent else 0.15

    def matches(self, value: float | None) -> bool:
        return value is not None and abs(value - self.paper) <= self.tolerance * abs(self.paper)


def _ratio(a, b):
    return None if a is None or not b else a / b - 1


def _at_capacity(s: dict, key: str) -> float:
    """Goodput within SLA at capacity (requests meeting the SLO per second there); without a
    capacity search, the fixed-load value."""
    return s.get({"goodput_rps": "goodput_at_capacity_rps", "bcr": "bcr_at_capacity"}[key], s[key])


FIGURES = [
    Figure("naive cross-DC TTFT P50 minus same-DC, s", 2.5,
           lambda s, c, p: c["ttft_p50_s"] - s["ttft_p50_s"], False, FITTED,
           "the WAN's background load (mean, std) was chosen to reproduce it"),
    Figure("naive cross-DC TTFT P90, s", 18.3, lambda s, c, p: c["ttft_p90_s"], False, FITTED,
           "the WAN's background load was chosen to reproduce it"),
    Figure("naive cross-DC TTFT P99, s", 29.7, lambda s, c, p: c["ttft_p99_s"], False, PREDICTED,
           "the tail the fitted WAN gives"),
    Figure("PDD TTFT (mean) vs naive cross-DC", -0.515,
           lambda s, c, p: _ratio(p["ttft_mean_s"], c["ttft_mean_s"]), True, PREDICTED,
           "relay decode masking the WAN"),
    Figure("PDD goodput within SLA vs same-DC", 0.278,
           lambda s, c, p: _ratio(_at_capacity(p, "goodput_rps"), _at_capacity(s, "goodput_rps")),
           True, PREDICTED, "capacity searched on both systems"),
    Figure("PDD BCR vs same-DC", 0.375,
           lambda s, c, p: _ratio(_at_capacity(p, "bcr"), _at_capacity(s, "bcr")), True, PREDICTED,
           "goodput per dollar at capacity"),
    Figure("PDD hardware cost vs same-DC", -0.053,
           lambda s, c, p: _ratio(p["cost_per_hour"], s["cost_per_hour"]), True, FITTED,
           "node counts and GPU prices were chosen to reproduce it"),
    Figure("RLD share of output tokens", 0.062, lambda s, c, p: p["rld_token_share"], True,
           PREDICTED, "relay threshold, handoff policy and the WAN's fluctuation"),
    Figure("WAN bytes without DRC / with DRC", 10.0,
           lambda s, c, p: p["wan_bytes_no_drc"] / p["wan_bytes"] if p["wan_bytes"] else None,
           False, PREDICTED, "the decode-side cache against the workload's hit rates"),
]


def figures_table(same: dict, cross: dict, pdd: dict) -> list[dict]:
    rows = []
    for f in FIGURES:
        value = f.ours(same, cross, pdd)
        rows.append({"figure": f.label, "paper": f.paper, "ours": value, "match": f.matches(value),
                     "percent": f.percent, "basis": f.basis, "tolerance": f.tolerance,
                     "why": f.why})
    return rows


def format_figures(rows: list[dict]) -> str:
    """The paper's figures beside ours, and whether each is within tolerance."""
    def show(v, percent):
        return "-" if v is None else (f"{v:+.1%}" if percent else f"{v:.2f}")
    table = pd.DataFrame({
        "paper": [show(r["paper"], r["percent"]) for r in rows],
        "ours": [show(r["ours"], r["percent"]) for r in rows],
        "basis": [r["basis"] for r in rows],
        "within tolerance": [f"{'yes' if r['match'] else 'no'} (±{r['tolerance']:.0%})" for r in rows],
    }, index=[r["figure"] for r in rows]).to_string()
    return (table + "\nfitted: a config value was chosen to reproduce the figure, so matching it is "
            "no evidence for the model; predicted: it emerges from the mechanisms.")
