"""The PDD paper's published figures (PDD.md) and how each is derived from our three runs, so
`pddsim compare` can print them side by side and say which match within tolerance: 5 points for
percentages, 15% for seconds and ratios."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pddsim.config import bundled

PAPER_CONFIGS = [bundled(f"paper/{name}.yaml") for name in ("same_dc_pd", "cross_dc_pd", "pdd")]


@dataclass(frozen=True)
class Figure:
    label: str
    paper: float
    ours: Callable[[dict, dict, dict], float | None]   # (same-DC, naive cross-DC, PDD) summaries
    percent: bool                                       # compared in points, else relatively

    def matches(self, value: float | None) -> bool:
        if value is None:
            return False
        if self.percent:
            return abs(value - self.paper) <= 0.05
        return abs(value - self.paper) <= 0.15 * abs(self.paper)


def _ratio(a, b):
    return None if a is None or not b else a / b - 1


def _at_capacity(s: dict, key: str) -> float:
    """Goodput within SLA is the paper's capacity; without a capacity search, the fixed-load value."""
    return s.get({"goodput_rps": "capacity_rps", "bcr": "bcr_at_capacity"}[key], s[key])


FIGURES = [
    Figure("naive cross-DC TTFT P50 minus same-DC, s", 2.5,
           lambda s, c, p: c["ttft_p50_s"] - s["ttft_p50_s"], False),
    Figure("naive cross-DC TTFT P90, s", 18.3, lambda s, c, p: c["ttft_p90_s"], False),
    Figure("naive cross-DC TTFT P99, s", 29.7, lambda s, c, p: c["ttft_p99_s"], False),
    Figure("PDD TTFT (mean) vs naive cross-DC", -0.515,
           lambda s, c, p: _ratio(p["ttft_mean_s"], c["ttft_mean_s"]), True),
    Figure("PDD goodput within SLA vs same-DC", 0.278,
           lambda s, c, p: _ratio(_at_capacity(p, "goodput_rps"), _at_capacity(s, "goodput_rps")),
           True),
    Figure("PDD BCR vs same-DC", 0.375,
           lambda s, c, p: _ratio(_at_capacity(p, "bcr"), _at_capacity(s, "bcr")), True),
    Figure("PDD hardware cost vs same-DC", -0.053,
           lambda s, c, p: _ratio(p["cost_per_hour"], s["cost_per_hour"]), True),
    Figure("RLD share of output tokens", 0.062, lambda s, c, p: p["rld_token_share"], True),
    Figure("WAN bytes without DRC / with DRC", 10.0,
           lambda s, c, p: p["wan_bytes_no_drc"] / p["wan_bytes"] if p["wan_bytes"] else None, False),
]


def figures_table(same: dict, cross: dict, pdd: dict) -> list[dict]:
    rows = []
    for f in FIGURES:
        value = f.ours(same, cross, pdd)
        rows.append({"figure": f.label, "paper": f.paper, "ours": value, "match": f.matches(value),
                     "percent": f.percent})
    return rows


def format_figures(rows: list[dict]) -> str:
    def show(v, percent):
        return "-" if v is None else (f"{v:+.1%}" if percent else f"{v:.2f}")
    width = max(len(r["figure"]) for r in rows)
    lines = [f"{'paper figure':<{width}}  {'paper':>8}  {'ours':>8}  within tolerance"]
    for r in rows:
        lines.append(f"{r['figure']:<{width}}  {show(r['paper'], r['percent']):>8}  "
                     f"{show(r['ours'], r['percent']):>8}  {'yes' if r['match'] else 'no'}")
    return "\n".join(lines)
