"""A faults study: several systems through their configured faults on one workload, minute by
minute (TTFT and SLO attainment of the requests arriving in each minute), with the windows the
faults were active, so what each system does during and after them can be read side by side."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from pddsim.config import Config, InstanceFault
from pddsim.sim import simulate
from pddsim.timeseries import window_table
from pddsim.workload.model import Workload

MINUTE_S = 60.0
ROWS = [("ttft_p90_s", "TTFT P90 s", "{:.3f}"), ("slo_attainment", "SLO attainment", "{:.1%}"),
        ("requests_completed", "completed", "{}"), ("requests_retried", "retried", "{}"),
        ("failed_instance_failed", "failed: instance_failed", "{}"),
        ("failed_transfer_timeout", "failed: transfer_timeout", "{}"),
        ("failed_stalled", "failed: stalled", "{}"), ("failed_other", "failed: other", "{}"),
        ("availability_decode", "decode pool available", "{:.2%}"),
        ("availability_wan", "WAN available", "{:.2%}"), ("pipeline_rld_only", "finished on RLD",
                                                          "{:.1%}")]


@dataclass
class FaultStudy:
    summaries: list[dict]
    per_minute: pd.DataFrame          # system, minute_start_s, arrivals, ttft_p90_s, slo_attainment
    faults: list[tuple[float, float, str]]   # (start, end, what) of every configured event


def fault_windows(cfg: Config, end_s: float) -> list[tuple[float, float, str]]:
    """When each scheduled fault was active (one that never ends lasts to `end_s`)."""
    out = []
    for ev in cfg.faults.events if cfg.faults is not None else []:
        what = (ev.instance or f"{ev.count or 'all'} {ev.role} down") \
            if isinstance(ev, InstanceFault) else f"{ev.link} {ev.kind.removeprefix('link_')}"
        end = end_s if ev.duration_s is None else ev.start_s + ev.duration_s
        out.append((ev.start_s, end, what))
    return out


def fault_study(configs: list[Config], workload: Workload, *, seed: int | None = None,
                on_progress=None) -> FaultStudy:
    summaries: list[dict] = []
    minutes: list[pd.DataFrame] = []
    faults: dict[tuple[float, float, str], None] = {}
    for cfg in configs:
        result = simulate(cfg, workload, seed, on_progress=on_progress)
        summaries.append(result.summary)
        w = window_table(result.requests, MINUTE_S)
        w = w[w["bucket"] == "all"].drop(columns=["bucket", "arrival_rps"])
        minutes.append(w.rename(columns={"window_start_s": "minute_start_s"})
                       .assign(system=cfg.name))
        for window in fault_windows(cfg, result.summary["sim_duration_s"]):
            faults.setdefault(window, None)
    per_minute = pd.concat(minutes, ignore_index=True)[
        ["system", "minute_start_s", "arrivals", "ttft_p90_s", "ttft_p50_s", "slo_attainment"]]
    return FaultStudy(summaries, per_minute, sorted(faults))


def attainment_during(study: FaultStudy, start_s: float, end_s: float) -> dict[str, float]:
    """Per system, the SLO attainment of the requests arriving in the minutes [start, end)."""
    df = study.per_minute
    inside = df[(df["minute_start_s"] >= start_s) & (df["minute_start_s"] < end_s)]
    met = (inside["slo_attainment"] * inside["arrivals"]).groupby(inside["system"], sort=False).sum()
    return (met / inside.groupby("system", sort=False)["arrivals"].sum()).to_dict()


def format_fault_study(study: FaultStudy) -> str:
    table = {s["system"]: {label: (fmt.format(s[key]) if s.get(key) is not None else "-")
                           for key, label, fmt in ROWS} for s in study.summaries}
    for start, end, what in study.faults:
        during = attainment_during(study, start, end)
        for system, row in table.items():
            row[f"SLO attainment, arrivals during {what}"] = f"{during.get(system, float('nan')):.1%}"
    lines = [pd.DataFrame(table).to_string(), "", "faults:"]
    lines += [f"  {start:g}-{end:g} s  {what}" for start, end, what in study.faults]
    return "\n".join(lines)


def plot_fault_study(study: FaultStudy, path: str | Path, margin_s: float = 600.0) -> None:
    """TTFT P90 and SLO attainment per minute of arrival, one line per system, faults shaded;
    shown from `margin_s` before the first fault to `margin_s` after the last one ends."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    df = study.per_minute
    if study.faults:
        lo = min(s for s, _, _ in study.faults) - margin_s
        hi = max(e for _, e, _ in study.faults) + margin_s
        df = df[(df["minute_start_s"] >= lo) & (df["minute_start_s"] <= hi)]
    fig = Figure(figsize=(9, 6))
    FigureCanvasAgg(fig)
    ax_t, ax_s = fig.subplots(2, 1, sharex=True)
    for system, part in df.groupby("system", sort=False):
        minutes = part["minute_start_s"] / 60.0
        ax_t.plot(minutes, part["ttft_p90_s"], marker=".", label=system)
        ax_s.plot(minutes, part["slo_attainment"], marker=".", label=system)
    colours = ("tab:red", "tab:purple", "tab:brown", "tab:gray")
    for i, (start, end, what) in enumerate(study.faults):
        for ax in (ax_t, ax_s):
            ax.axvspan(start / 60.0, end / 60.0, alpha=0.12, color=colours[i % len(colours)],
                       label=what if ax is ax_s else None)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("TTFT P90 (s)")
    ax_s.set_ylabel("SLO attainment")
    ax_s.set_xlabel("minute of arrival")
    ax_s.set_ylim(0, 1.02)
    ax_t.legend(fontsize=8)
    ax_s.legend(fontsize=8, loc="lower left")
    ax_t.set_title("Requests arriving in each minute, through the faults")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
