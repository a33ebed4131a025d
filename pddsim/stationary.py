"""Where a run is stationary: the window of its issue times over which the load neither ramps up
nor drains, so that a rate or a share measured there belongs to the deployment and not to the
run's length.

The load is the number of requests in flight, sampled on a regular grid from the first issue to the
last session start (after it no session starts and the load only drains: those issues are left
out). The warm-up is deleted by MSER-5 (White, 1997): the samples are cut into batches of five and
the window starts after the d batches that minimise the standard error of the remaining batch
means, d searched over the first half. The window is stationary if the remaining batch means show
no trend: a least-squares line over them may not drift by more than `MAX_DRIFT` of their mean
across the window unless the drift is within two standard errors of zero. Fewer than `MIN_BATCHES`
batches left is not a window.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

SAMPLES = 250            # in-flight samples over the issue span
BATCH = 5                # MSER-5
MIN_BATCHES = 8
MAX_DRIFT = 0.2
RATE_BATCHES = 10        # batch means of the window's issue rate, for its 95% interval
MIN_WINDOW_S = 1e-6      # the clock's resolution: no rate is measured over less
T975_9 = 2.262           # two-sided 95% Student-t quantile, 9 degrees of freedom


@dataclass(frozen=True)
class Window:
    start_s: float
    end_s: float
    stationary: bool


def issue_end(requests: pd.DataFrame) -> float:
    """The last session start: the latest first issue of a session (a request without a session
    is one of its own)."""
    arrival, session = requests["arrival_s"].to_numpy(), requests["session"].to_numpy()
    own = session < 0
    starts = [arrival[own].max()] if own.any() else []
    if (~own).any():
        starts.append(pd.Series(arrival[~own]).groupby(session[~own]).min().max())
    return float(max(starts))


def in_flight(requests: pd.DataFrame, times: np.ndarray) -> np.ndarray:
    """Requests issued and not yet ended at each of `times`."""
    issued = np.sort(requests["arrival_s"].to_numpy())
    ended = np.sort(requests["finish_s"].to_numpy())
    return (np.searchsorted(issued, times, side="right")
            - np.searchsorted(ended, times, side="right")).astype(float)


def mser(batches: np.ndarray) -> int:
    """Batches to delete: the d in the first half minimising the standard error of the rest's mean."""
    m = len(batches)
    best, best_d = np.inf, 0
    for d in range(m // 2 + 1):
        rest = batches[d:]
        score = rest.var() / len(rest)
        if score < best:
            best, best_d = score, d
    return best_d


def steady_window(requests: pd.DataFrame) -> Window:
    """The stationary window of a run's requests (issue and end times)."""
    if len(requests) < 2:
        return Window(0.0, 0.0, False)
    t0, t1 = float(requests["arrival_s"].min()), issue_end(requests)
    if t1 <= t0:
        return Window(t0, t1, False)
    times = np.linspace(t0, t1, SAMPLES)
    load = in_flight(requests, times)
    batches = load[: len(load) // BATCH * BATCH].reshape(-1, BATCH).mean(axis=1)
    d = mser(batches)
    start = float(times[d * BATCH])
    rest = batches[d:]
    if len(rest) < MIN_BATCHES or rest.mean() <= 0:
        return Window(start, t1, False)
    x = np.arange(len(rest), dtype=float)
    slope, intercept = np.polyfit(x, rest, 1)
    residual = rest - (slope * x + intercept)
    se = np.sqrt(residual.var() * len(rest) / max(len(rest) - 2, 1) / ((x - x.mean()) ** 2).sum())
    drift = slope * (len(rest) - 1)
    trend = abs(drift) > MAX_DRIFT * rest.mean() and abs(slope) > 2 * se
    return Window(start, t1, not trend)


def rate_interval(arrival: np.ndarray, start_s: float, end_s: float) -> tuple[float, float]:
    """95% interval of the issue rate over [start_s, end_s] by batch means: the window cut into
    `RATE_BATCHES` equal spans, each span's rate one sample (spans longer than a session's life
    are near independent; shorter ones make the interval too narrow)."""
    counts = np.histogram(arrival, bins=np.linspace(start_s, end_s, RATE_BATCHES + 1))[0]
    rates = counts / ((end_s - start_s) / RATE_BATCHES)
    half = T975_9 * rates.std(ddof=1) / np.sqrt(RATE_BATCHES)
    return float(rates.mean() - half), float(rates.mean() + half)


def steady_summary(requests: pd.DataFrame) -> dict:
    """The run's figures inside its stationary window: the rate of the requests issued there, its
    95% interval by batch means, and their SLO share, None when the run never becomes stationary;
    the window's bounds and flag."""
    w = steady_window(requests)
    figures = window_figures(requests, w.start_s, w.end_s)
    ok = w.stationary and figures["steady_rps"] is not None
    return {
        "steady_window_start_s": w.start_s,
        "steady_window_end_s": w.end_s,
        "steady_stationary": bool(w.stationary),
        **{k: v if ok else None for k, v in figures.items()},
    }


def window_figures(requests: pd.DataFrame, start_s: float, end_s: float) -> dict:
    """The rate of the requests issued in [start_s, end_s], its interval and their SLO share
    (None without two requests there, or in a window shorter than the clock's microsecond: no rate
    is measured over no time), whether or not the window is stationary."""
    arrival = requests["arrival_s"].to_numpy()
    inside = (arrival >= start_s) & (arrival <= end_s)
    if end_s - start_s < MIN_WINDOW_S or inside.sum() < 2:
        return dict.fromkeys(("steady_rps", "steady_rps_lo", "steady_rps_hi",
                              "steady_slo_attainment"))
    lo, hi = rate_interval(arrival, start_s, end_s)
    return {"steady_rps": float((inside.sum() - 1) / (end_s - start_s)), "steady_rps_lo": lo,
            "steady_rps_hi": hi,
            "steady_slo_attainment": float(requests["slo_met"].to_numpy()[inside].mean())}


def always_inside_from(first_issue_s: float, last_start_s: float) -> float:
    """The earliest time from which every issue up to `last_start_s` lies inside the stationary
    window, whatever MSER deletes (at most the first half of the batches): known before the run
    ends, so a run can be judged on the requests issued there while it runs."""
    times = np.linspace(first_issue_s, last_start_s, SAMPLES)
    return float(times[(SAMPLES // BATCH // 2) * BATCH])
