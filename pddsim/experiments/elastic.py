"""The elastic-pools study (docs/elastic.md): systems over a simulated day of Agent traffic whose
session rate follows a working-day curve, each run twice: static at peak (its configured pools,
sized for the config's session rate, held all day) and elastic (prefill and decode pools each
under a reactive controller of their own, at most the static count). GPU-hours held per role,
cost and SLO attainment side by side.

The day is compressed (`day_s`, 4 h by default) so the six runs of the three paper systems take
minutes on a small machine; start-up times stay real, so a ramp is steeper against them than in
a real day (the elastic figures are, if anything, pessimistic).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from pddsim.config import AgentSynthetic, Config, from_dict, parse_diurnal
from pddsim.errors import InputError
from pddsim.sim import load_workload, simulate
from pddsim.workload.model import Workload
from pddsim.workload.synthetic import curve_mean

# a working day relative to the peak session rate (the config's): nights at a quarter, a morning
# ramp to the peak from 10:00 to 17:00, an evening half
DAY_CURVE = "0:0.25,7:0.25,10:1,17:1,21:0.5"
DAY_S = 4 * 3600.0
ROLES = ("prefill", "relay", "decode")


def reactive(role: str, cfg: Config, most: int) -> dict:
    """The controller the study gives a pool: each tracks its queue (1 request waiting per
    instance: a decoder's waiting requests hold back their first token); prefill also the TTFT of
    recent requests (a quarter of the SLO's), decode its KV occupancy (80%) and the TPOT of recent
    requests (80% of the SLO's), at P90, every 30 s, 5 minutes between changes. The relay pool
    stays as configured."""
    base = {"policy": "reactive", "min": 1, "max": most, "queue_per_instance": 1.0}
    if role == "prefill":
        return {**base, "ttft_s": cfg.slo.ttft_s / 4}
    return {**base, "kv_occupancy": 0.8, "tpot_s": cfg.slo.tpot_s * 0.8}


def day_config(cfg: Config, curve: str, day_s: float) -> Config:
    """`cfg` with its Agent workload spread over one day of `day_s` seconds along `curve`, its
    session rate the peak, as many sessions as the day holds."""
    synthetic = cfg.workload.synthetic
    if not isinstance(synthetic, AgentSynthetic):
        raise InputError(f"{cfg.name}: workload.synthetic: the elastic study needs an agent "
                         "workload (its session rate follows the day)")
    try:
        mean = curve_mean(curve)
    except ValueError as e:
        raise InputError(f"the day curve: {e}") from None
    # the peak: the offered session rate of a horizon workload, else the generator's own; the day
    # replaces the horizon
    peak = synthetic.knobs.session_rate
    if cfg.workload.horizon_s is not None and cfg.workload.session_rate_rps is not None:
        peak = cfg.workload.session_rate_rps
    raw = cfg.model_dump()
    raw["workload"]["horizon_s"] = None
    raw["workload"]["synthetic"]["knobs"].update(
        diurnal=curve, day_s=day_s, session_rate=peak,
        sessions=max(1, round(mean * peak * day_s)))
    return from_dict(raw, cfg.name)


def elastic_config(cfg: Config, curve: str) -> Config:
    """`cfg` with its prefill and decode groups under the study's controllers, starting with as
    many instances as the curve's midnight share of the static count."""
    start = parse_diurnal(curve)[1][0] / max(parse_diurnal(curve)[1])
    raw = cfg.model_dump()
    for cluster in raw["clusters"].values():
        for group in cluster["instances"]:
            if group["role"] in ("prefill", "decode"):
                most = group["count"]
                group["scaling"] = reactive(group["role"], cfg, most)
                group["count"] = max(1, math.ceil(most * start))
    raw["name"] = f"{cfg.name} (elastic)"
    return from_dict(raw, cfg.name)


@dataclass
class DayStudy:
    table: pd.DataFrame               # one row per system and mode
    summaries: list[dict]


def gpu_hours(cfg: Config, summary: dict, role: str) -> float:
    """GPU-hours a role held: from the run's record when it scaled, else its groups all run."""
    key = f"gpu_hours_{role}"
    if key in summary:
        return summary[key]
    gpus = sum(g.count * g.gpus for c in cfg.clusters.values() for g in c.instances if g.role == role)
    return gpus * summary["sim_duration_s"] / 3600


def day_study(configs: list[Config], *, curve: str = DAY_CURVE, day_s: float = DAY_S,
              seed: int | None = None, on_progress=None) -> DayStudy:
    """Each config static at peak then elastic, on one day workload (the first config's)."""
    days = [day_config(cfg, curve, day_s) for cfg in configs]
    workload: Workload = load_workload(days[0])
    rows, summaries = [], []
    for cfg in days:
        for mode, run_cfg in (("static at peak", cfg), ("elastic", elastic_config(cfg, curve))):
            s = simulate(run_cfg, workload, seed, on_progress=on_progress).summary
            summaries.append(s)
            hours = {role: gpu_hours(run_cfg, s, role) for role in ROLES}
            rows.append({
                "system": cfg.name, "mode": mode,
                **{f"GPU-h {role}": hours[role] for role in ROLES},
                "GPU-h total": sum(hours.values()),
                "cost $/h": s["cost_per_hour"], "SLO attainment": s["slo_attainment"],
                "TTFT P90 s": s["ttft_p90_s"], "TPOT P99 s": s["tpot_p99_s"], "BCR": s["bcr"],
                "scale events": sum(s.get(f"scale_{d}_{r}", 0) for d in ("ups", "downs")
                                    for r in ROLES),
                "served while short": s.get("requests_while_short_share", 0.0)})
    return DayStudy(pd.DataFrame(rows), summaries)


def format_day_study(study: DayStudy) -> str:
    t = study.table.set_index(["system", "mode"]).T
    fmt = {"SLO attainment": "{:.1%}", "served while short": "{:.1%}", "scale events": "{:.0f}",
           "TTFT P90 s": "{:.2f}", "TPOT P99 s": "{:.4f}"}
    return t.apply(lambda row: row.map(lambda v: fmt.get(row.name, "{:.1f}").format(v)),
                   axis=1).to_string()
