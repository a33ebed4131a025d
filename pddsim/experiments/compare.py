"""Several systems on the same workload, side by side, with deltas against the first: at the
workload's load, or across loads given as fractions of the first system's capacity."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pddsim.config import Config
from pddsim.errors import InputError
from pddsim.experiments.capacity import (
    Capacity,
    at_load,
    distinguishable,
    find_capacity,
    load_knob,
    resample_source,
)
from pddsim.sim import load_workload, prepare_out_dir, simulate
from pddsim.workload.model import Workload

ROLE_LETTERS = {"prefill": "P", "decode": "D", "relay": "RLD", "colocated": "C"}
# (summary key, label, how to show it)
ROWS = [
    ("split", "split", "{}"),
    ("slo_ttft_s", "SLO: TTFT s", "{:g}"),          # the SLO rows: shown only where they differ
    ("slo_tpot_s", "SLO: TPOT s", "{:g}"),
    ("slo_target", "SLO: target", "{:.0%}"),
    ("achieved_rps", "achieved rps", "{:.3f}"),
    ("steady_rps", "steady rps", "{:.3f}"),
    ("ttft_p50_s", "TTFT P50 s", "{:.3f}"),
    ("ttft_p90_s", "TTFT P90 s", "{:.3f}"),
    ("ttft_p99_s", "TTFT P99 s", "{:.3f}"),
    ("ttft_mean_s", "TTFT mean s", "{:.3f}"),
    ("tpot_mean_s", "TPOT mean s", "{:.4f}"),
    ("itl_max_p99_s", "max ITL P99 s", "{:.3f}"),
    ("slo_attainment", "SLO attainment", "{:.1%}"),
    ("goodput_rps", "goodput rps", "{:.3f}"),
    ("capacity_rps", "capacity rps", "{:.3f}"),
    ("capacity_interval", "capacity 95% interval", "{}"),
    ("capacity_apart", "capacity apart from first", "{}"),
    ("capacity_status", "capacity status", "{}"),
    ("capacity_lower_bound_rps", "capacity not found, >= rps", "{:.3f}"),
    ("goodput_at_capacity_rps", "goodput at capacity rps", "{:.3f}"),
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


def slo_label(cfg: Config) -> str:
    return f"TTFT {cfg.slo.ttft_s:g} s, TPOT {cfg.slo.tpot_s:g} s, target {cfg.slo.target:.0%}"


def mixed_slo(configs: list[Config]) -> str | None:
    """Systems measured against different SLOs, said in one sentence (None: one SLO): their SLO
    attainment, goodput, capacity and BCR answer different questions."""
    labels = {cfg.name: slo_label(cfg) for cfg in configs}
    if len(set(labels.values())) <= 1:
        return None
    return "the systems' SLOs differ (" + "; ".join(f"{n}: {s}" for n, s in labels.items()) + \
        "): SLO attainment, goodput, capacity and BCR are each against its own SLO"


def compare(configs: list[Config], workload: Workload, *, seed: int | None = None,
            capacity: bool = False, on_progress=None, out_dir: str | Path | None = None) -> list[dict]:
    """One summary per system at the workload's load; with `capacity`, each also gets its
    capacity (`pddsim.experiments.capacity`: `capacity_rps`, its interval and status), the
    goodput and BCR there (None when not found; `capacity_lower_bound_rps` when the search never
    saturated), and whether its interval is apart from the first system's (`capacity_apart`:
    when not, the two capacities are not distinguishable). `out_dir`: each system's run at the
    workload's load is written to a subfolder (`pddsim report` reads them as one comparison)."""
    summaries = []
    first: Capacity | None = None
    if out_dir is not None:
        prepare_out_dir(out_dir, runs_below=True)
    for i, cfg in enumerate(configs):
        result = simulate(cfg, workload, seed, on_progress=on_progress)
        if out_dir is not None:
            result.write(Path(out_dir) / run_folder(i, cfg.name))
        summary = result.summary
        summary["split"] = split_label(cfg)
        if capacity:
            cap = find_capacity(cfg, workload, seed=seed, on_progress=on_progress)
            first = first or cap
            summary.update(capacity_figures(cap))
            if i:
                apart = distinguishable(first.interval, cap.interval)
                summary["capacity_apart"] = None if apart is None else ("yes" if apart else
                                                                        "no: not distinguishable")
        summaries.append(summary)
    return summaries


def capacity_figures(cap: Capacity) -> dict:
    """What a comparison shows of a capacity search."""
    figures = {"capacity_rps": cap.capacity_rps, "capacity_status": cap.status,
               "capacity_interval": f"[{cap.interval[0]:.3f}, {cap.interval[1]:.3f}]"
               if cap.interval else None,
               "goodput_at_capacity_rps": cap.goodput_rps, "bcr_at_capacity": cap.bcr}
    if cap.status == "never saturated":
        figures["capacity_lower_bound_rps"] = cap.lower_bound_rps
    return figures
def run_folder(i: int, name: str) -> str:
    """The subfolder of the `i`-th system's run: its name with anything but letters, digits, '.',
    '-' and '_' replaced, so that no name (`../x`) writes outside the folder."""
    return f"{i + 1}-" + re.sub(r"[^\w.-]", "_", name)


def split_label(cfg: Config) -> str:
    """Instances per role and cluster: `3P + 8D`, `4P + 1RLD | 4MD` (a decoder beside a relay
    cluster is the main decoder)."""
    relay = any(g.role == "relay" for c in cfg.clusters.values() for g in c.instances)
    return " | ".join(" + ".join(
        f"{g.count}{'MD' if relay and g.role == 'decode' else ROLE_LETTERS[g.role]}"
        for g in cluster.instances) for cluster in cfg.clusters.values())


def format_cell(fmt: str, key: str, value) -> str:
    if value is None:
        return "-"
    return fmt.format(value / 1e9 if key == "wan_bytes" else value)


def relative_change(base, value) -> float | None:
    """`value` against `base` as a share of the base's size, so the sign is the direction of the
    move whatever the base's sign (a margin of -55.9 falling to -101.5 is -82%, not +82%); None
    when either is missing or the base is 0."""
    if base is None or value is None or not base:
        return None
    return (value - base) / abs(base)


def comparison_frame(summaries: list[dict], rows_shown: list[tuple[str, str, str]] = ROWS
                     ) -> pd.DataFrame:
    """Metrics down (labelled with their units), systems across, as text; each system after the
    first also shows its relative delta against the first. An SLO row is shown only where the
    SLOs differ."""
    base = summaries[0]
    rows = {}
    for key, label, fmt in rows_shown:
        if all(key not in s for s in summaries) or (
                key.startswith("slo_") and len({s.get(key) for s in summaries}) == 1):
            continue
        cells = []
        for i, s in enumerate(summaries):
            cell = format_cell(fmt, key, s.get(key))
            change = relative_change(base.get(key), s.get(key)) if i and fmt != "{}" else None
            if change is not None:
                cell += f" ({change:+.0%})"
            cells.append(cell)
        rows[label] = cells
    return pd.DataFrame.from_dict(rows, orient="index", columns=[s["system"] for s in summaries])


def format_comparison(summaries: list[dict], rows_shown: list[tuple[str, str, str]] = ROWS) -> str:
    return comparison_frame(summaries, rows_shown).to_string()


# what a comparison across loads reports at each load
LOAD_METRICS = ("achieved_rps", "ttft_p50_s", "ttft_p90_s", "ttft_mean_s")
LOAD_ROWS = [row for row in ROWS if row[0] in LOAD_METRICS]


def parse_loads(text: str) -> list[float]:
    """`START:STOP:STEP` -> the fractions START, START+STEP, ... up to STOP included."""
    try:
        start, stop, step = (float(x) for x in text.split(":"))
    except ValueError:
        start = stop = step = -1.0
    if not (0 < start <= stop and step > 0):
        raise InputError(f"--loads {text}: expected START:STOP:STEP with 0 < START <= STOP, STEP > 0")
    count = int(np.floor((stop - start) / step + 1e-9)) + 1
    return [round(start + i * step, 10) for i in range(count)]


@dataclass
class LoadComparison:
    capacity: Capacity      # the first system's: the loads are fractions of it
    loads: list[float]
    summaries: list[list[dict]]     # per load, one summary per system

    def points(self) -> list[dict]:
        """One flat row per (load, system): the load, the knob value it set, the system's
        achieved rate and TTFT statistics, and their relative deltas against the first system."""
        rows = []
        for load, summaries in zip(self.loads, self.summaries):
            base = summaries[0]
            for s in summaries:
                row = {"load": load, self.capacity.knob: _knob_value(self.capacity, load),
                       "system": s["system"], **{k: s[k] for k in LOAD_METRICS}}
                for k in LOAD_METRICS[1:]:
                    row[f"{k.removesuffix('_s')}_delta"] = relative_change(base[k], s[k])
                rows.append(row)
        return rows

    def to_json(self) -> dict:
        cap = self.capacity
        return {"reference": self.summaries[0][0]["system"], "capacity_rps": cap.capacity_rps,
                "capacity_found": cap.found, "capacity_lower_bound_rps": cap.lower_bound_rps,
                "knob": cap.knob, "knob_at_capacity": cap.load, "points": self.points()}


def _knob_value(cap: Capacity, fraction: float) -> float:
    value = fraction * cap.load
    return max(1, round(value)) if cap.knob == "concurrent_sessions" else value


def compare_across_loads(configs: list[Config], workload: Workload, loads: list[float], *,
                         seed: int | None = None, on_progress=None) -> LoadComparison:
    """Every system at each fraction of the first system's capacity. A load is set on the load
    knob (its value at capacity times the fraction), so at each load every system replays the
    same traffic; each still reports the rate it achieved, which in closed loop is its own. When
    the first system's capacity is not found, the fractions are of the lower bound."""
    knobs = {load_knob(cfg) for cfg in configs}
    if len(knobs) > 1:
        raise InputError(f"--loads: the systems' loads are set by different knobs ({sorted(knobs)}): "
                         "give them the same workload.session_start")
    cap = find_capacity(configs[0], workload, seed=seed, on_progress=on_progress)
    source = resample_source(configs[0]) if cap.knob == "session_rate_rps" else None

    def traffic(fraction: float) -> Workload:
        """The load's traffic: a horizon workload's sessions started at that rate (the same for
        every system), else the one workload replayed at the knob's value."""
        if cap.knob != "session_rate_rps":
            return workload
        return load_workload(at_load(configs[0], _knob_value(cap, fraction)), source)

    summaries = []
    for f in loads:
        w = traffic(f)
        summaries.append([simulate(at_load(cfg, _knob_value(cap, f)), w, seed,
                                   on_progress=on_progress).summary for cfg in configs])
    return LoadComparison(cap, loads, summaries)


def format_loads(cmp: LoadComparison) -> str:
    cap = cmp.capacity
    first = cmp.summaries[0][0]["system"]
    rate = (f"capacity {cap.capacity_rps:.3f} req/s" if cap.found else
            f"capacity not found, fractions of its lower bound {cap.lower_bound_rps:.3f} req/s")
    parts = [f"loads as fractions of {first}'s {rate} ({cap.knob} {cap.load:.4g})"]
    for load, summaries in zip(cmp.loads, cmp.summaries):
        parts.append(f"\nload {load:g} ({cap.knob} {_knob_value(cap, load):.4g})")
        parts.append(format_comparison(summaries, LOAD_ROWS))
    return "\n".join(parts)


def plot_loads(cmp: LoadComparison, path: str | Path) -> None:
    """TTFT P50 (solid) and P90 (dashed) of each system against the load, and each later
    system's P50 and mean deltas against the first."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = [s["system"] for s in cmp.summaries[0]]
    series = {k: np.array([[np.nan if s[k] is None else s[k] for s in at] for at in cmp.summaries])
              for k in LOAD_METRICS}
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ttft, delta = fig.subplots(1, 2)
    for i, name in enumerate(names):
        color = f"C{i}"
        ttft.plot(cmp.loads, series["ttft_p50_s"][:, i], "-o", color=color, label=f"{name} P50")
        ttft.plot(cmp.loads, series["ttft_p90_s"][:, i], "--", color=color, label=f"{name} P90")
        if i:
            for key, style in (("ttft_p50_s", "-o"), ("ttft_mean_s", ":s")):
                rel = 100 * (series[key][:, i] / series[key][:, 0] - 1)
                delta.plot(cmp.loads, rel, style, color=color, label=f"{name} {key[5:-2]}")
    ttft.set_yscale("log")
    ttft.set_ylabel("TTFT s")
    delta.axhline(0, color="grey", lw=0.8)
    delta.set_yscale("symlog", linthresh=10)      # cross-DC is thousands of % off, PDD tens
    delta.set_ylabel(f"TTFT vs {names[0]}, %")
    for ax in (ttft, delta):
        ax.set_xlabel(f"load, fraction of {names[0]}'s capacity")
        ax.legend(fontsize="small")
    fig.savefig(path)
