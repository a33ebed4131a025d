"""One self-contained interactive HTML page from what `pddsim run --out`, `compare --out`,
`plan --out` or `sweep --out` wrote: provenance first, the headline table with units and deltas
against the first system, then figures one can hover, zoom and toggle.

Runs are overlaid on one time axis (in minutes or hours, as the run's length asks), TTFT and SLO
attainment carry their SLO lines, link throughput is in Gb/s, a window without arrivals is a gap
rather than a straight line across it, and legends sit above the plot, off the data. The plotting
library's JavaScript (Plotly) is embedded, so the page opens offline and can be mailed or archived
as one file.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import pandas as pd

from pddsim.errors import InputError
from pddsim.experiments.compare import comparison_frame
from pddsim.metrics import by_bucket, stage_table
from pddsim.sim import RUN_TABLES

TABLE_FILES = (".parquet", ".csv")


class Run:
    """The tables of one run directory, and its provenance when it recorded one."""

    def __init__(self, path: Path):
        self.path = path
        self.summary = _read_json(path / "summary.json")
        self.provenance = self.summary.get("provenance") or sidecar_provenance(path)
        self.name = str(self.summary.get("system") or path.name)
        self.tables = {table: _read_table(path, table) for table in RUN_TABLES}

    def table(self, name: str) -> pd.DataFrame:
        found = self.tables.get(name)
        return found if found is not None else pd.DataFrame()


def _read_json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a JSON object")
    return doc


def sidecar_provenance(path: Path) -> dict | None:
    """What produced the outputs at `path`, when it recorded that beside them: a folder's
    `provenance.json`, a table's `TABLE.provenance.json` (a sweep's)."""
    sidecar = path / "provenance.json" if path.is_dir() else path.with_name(
        path.name + ".provenance.json")
    return _read_json(sidecar) if sidecar.is_file() else None


def _read_table(folder: Path, name: str) -> pd.DataFrame | None:
    for suffix, read in ((".parquet", pd.read_parquet), (".csv", pd.read_csv),
                         (".jsonl", lambda p: pd.read_json(p, lines=True))):
        path = folder / f"{name}{suffix}"
        if path.is_file():
            return _read(path, read)
    return None


def _read(path: Path, read=None) -> pd.DataFrame:
    read = read or (pd.read_parquet if path.suffix == ".parquet" else pd.read_csv)
    try:
        return read(path)
    except (ValueError, OSError) as e:
        raise InputError(f"{path}: cannot read table ({e})") from None


def find_runs(path: Path) -> tuple[list[Run], dict[str, pd.DataFrame]]:
    """The runs at `path` (itself, or its subfolders) and any other tables lying there (a plan's
    points); a table file given directly (a sweep's) is read as such."""
    if path.is_file() and path.suffix in TABLE_FILES:
        return [], {path.stem: _read(path)}
    if not path.is_dir():
        raise InputError(f"{path}: not a directory or a .parquet / .csv table (give what "
                         "`pddsim run --out`, `compare --out`, `plan --out` or `sweep --out` wrote)")
    if (path / "summary.json").is_file():
        runs = [Run(path)]
    else:
        runs = [Run(p) for p in sorted(path.iterdir()) if (p / "summary.json").is_file()]
    extra = {p.stem: _read(p) for p in sorted(path.iterdir())
             if p.suffix in TABLE_FILES and p.stem not in RUN_TABLES}
    if not runs and not extra:
        raise InputError(f"{path}: no summary.json here or in its subfolders and no table "
                         "(give what `pddsim run --out`, `compare --out` or `plan --out` wrote)")
    return runs, extra


# -- figures ------------------------------------------------------------------------------------
LEGEND = {"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0}
# a run keeps its colour in every figure; a run's pools or links differ by dash
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def _colour(i: int) -> str:
    return COLOURS[i % len(COLOURS)]


def _layout(title: str, xtitle: str, ytitle: str, **extra) -> dict:
    """A figure's layout: titles, the legend above the plot (off the data), closest-point hover."""
    return {"title": {"text": title, "x": 0, "xanchor": "left"}, "legend": LEGEND,
            "margin": {"t": 90, "r": 20, "b": 50, "l": 70}, "height": 380, "hovermode": "closest",
            "xaxis": {"title": {"text": xtitle}}, "yaxis": {"title": {"text": ytitle}}, **extra}


def _values(a) -> list:
    """Plain JSON values (NaN as null: a gap in a line)."""
    return [None if v is None or (isinstance(v, float) and np.isnan(v)) else v
            for v in np.asarray(a, dtype=object).tolist()]


def time_unit(seconds: float) -> tuple[str, float]:
    """The unit a time axis this long reads best in, and seconds per unit."""
    if seconds >= 2 * 3600:
        return "h", 3600.0
    if seconds >= 120:
        return "min", 60.0
    return "s", 1.0


def _slo_line(value: float, label: str, axis: str = "x") -> dict:
    """A dashed line across the plot at `value` on `axis`, labelled."""
    other = "y" if axis == "x" else "x"
    return {"type": "line", f"{axis}0": value, f"{axis}1": value, f"{other}ref": "paper",
            f"{other}0": 0, f"{other}1": 1, "line": {"dash": "dash", "color": "#c0392b", "width": 1},
            "label": {"text": label, "textposition": "end", "font": {"size": 11, "color": "#c0392b"}}}


def _slo_lines(runs: list[Run], key: str, unit: str, axis: str) -> list[dict]:
    """One line per distinct SLO value of the runs, naming the runs when they differ."""
    shown: dict[float, list[str]] = {}
    for run in runs:
        value = run.summary.get(key)
        if value is not None:
            shown.setdefault(value, []).append(run.name)
    many = len(shown) > 1
    return [_slo_line(v, f"SLO {v:g} {unit}" + (f" ({', '.join(names)})" if many else ""), axis)
            for v, names in shown.items()]


def ttft_cdf(runs: list[Run]) -> dict | None:
    traces = []
    for i, run in enumerate(runs):
        df = run.table("requests")
        if "ttft_s" not in df:
            continue
        values = np.sort(df.loc[df["status"] == "completed", "ttft_s"].dropna().to_numpy())
        if len(values):
            traces.append({"type": "scatter", "mode": "lines",
                           "line": {"shape": "hv", "color": _colour(i)},
                           "name": run.name, "x": _values(values),
                           "y": _values(np.arange(1, len(values) + 1) / len(values)),
                           "hovertemplate": "TTFT %{x:.3f} s: %{y:.1%} of requests"})
    if not traces:
        return None
    return {"data": traces, "layout": _layout(
        "TTFT distribution (completed requests)", "TTFT (s, log scale)", "share of requests",
        shapes=_slo_lines(runs, "slo_ttft_s", "s", "x"),
        xaxis={"type": "log", "title": {"text": "TTFT (s, log scale)"}},
        yaxis={"tickformat": ".0%", "range": [0, 1.02], "title": {"text": "share of requests"}})}


def ttft_by_bucket(runs: list[Run]) -> dict | None:
    traces = []
    for i, run in enumerate(runs):
        df = run.table("requests")
        if "hit_bucket" not in df:
            continue
        table = by_bucket(df.assign(hit_bucket=pd.Categorical(df["hit_bucket"])))
        traces.append({"type": "bar", "name": run.name, "marker": {"color": _colour(i)},
                       "x": [str(b) for b in table.index],
                       "y": _values(table["ttft_p90_s"]),
                       "hovertemplate": "hit %{x}%: TTFT P90 %{y:.3f} s"})
    if not traces:
        return None
    return {"data": traces, "layout": _layout(
        "TTFT P90 by prefix-hit bucket", "prefix hit rate bucket (%)", "TTFT P90 (s)",
        barmode="group", shapes=_slo_lines(runs, "slo_ttft_s", "s", "y"))}


def _window_period(starts: np.ndarray) -> float | None:
    steps = np.diff(np.unique(starts))
    return float(steps.min()) if len(steps) else None


def _windows(run: Run) -> pd.DataFrame:
    """The run's per-window figures over every window from the first to the last, a window with no
    arrivals a row of NaN (so a line breaks there instead of bridging it)."""
    w = run.table("windows")
    if w.empty:
        return w
    w = w[w["bucket"] == "all"].set_index("window_start_s")
    period = _window_period(w.index.to_numpy())
    if period is None:
        return w.reset_index()
    full = np.round(np.arange(0, w.index.max() / period + 0.5) * period, 9)
    w.index = np.round(w.index.to_numpy(), 9)
    return w.reindex(full).rename_axis("window_start_s").reset_index()


def _span_s(runs: list[Run]) -> float:
    return max((float(r.summary.get("sim_duration_s") or 0.0) for r in runs), default=0.0)


def windows_figure(runs: list[Run], column: str, title: str, ylabel: str, slo_key: str,
                   slo_unit: str, percent: bool = False) -> dict | None:
    unit, per = time_unit(_span_s(runs))
    traces = []
    for i, run in enumerate(runs):
        w = _windows(run)
        if w.empty:
            continue
        traces.append({"type": "scatter", "mode": "lines+markers", "marker": {"size": 4},
                       "line": {"color": _colour(i)},
                       "name": run.name, "x": _values(w["window_start_s"] / per),
                       "y": _values(w[column]), "connectgaps": False,
                       "hovertemplate": f"%{{x:.2f}} {unit}: %{{y:{'.1%' if percent else '.3f'}}}"})
    if not traces:
        return None
    layout = _layout(title, f"arrival time ({unit})", ylabel,
                     shapes=_slo_lines(runs, slo_key, slo_unit, "y"))
    if percent:
        layout["yaxis"].update(tickformat=".0%", range=[0, 1.05])
        layout["shapes"] = [_slo_line(t, f"SLO target {t:.0%}", "y")
                            for t in {r.summary.get(slo_key) for r in runs} if t is not None]
    return {"data": traces, "layout": layout}


def pool_series(runs: list[Run], metric: str, title: str, ylabel: str, percent: bool = False
                ) -> dict | None:
    """One line per run and pool (instances of a role averaged) over the shared time axis."""
    unit, per = time_unit(_span_s(runs))
    traces = []
    for i, run in enumerate(runs):
        ts, inst = run.table("timeseries"), run.table("instances")
        if ts.empty or inst.empty:
            continue
        rows = ts[ts["metric"] == metric]
        roles = rows["entity"].astype(str).map(dict(zip(inst["instance"], inst["role"])))
        pools = rows.assign(pool=roles).dropna(subset=["pool"]).groupby(["pool", "time_s"])["value"]
        for k, (pool, part) in enumerate(pools.mean().groupby(level=0)):
            traces.append({"type": "scatter", "mode": "lines", "name": f"{run.name}: {pool}",
                           "line": {"color": _colour(i), "dash": DASHES[k % len(DASHES)]},
                           "x": _values(part.index.get_level_values(1) / per), "y": _values(part),
                           "hovertemplate": f"%{{x:.2f}} {unit}: %{{y:{'.1%' if percent else '.2f'}}}"})
    if not traces:
        return None
    layout = _layout(title, f"simulated time ({unit})", ylabel)
    if percent:
        layout["yaxis"].update(tickformat=".0%")
    return {"data": traces, "layout": layout}


def link_series(runs: list[Run]) -> dict | None:
    """Each link's throughput of our transfers, Gb/s, and what background load left of it."""
    unit, per = time_unit(_span_s(runs))
    traces = []
    for i, run in enumerate(runs):
        ts = run.table("timeseries")
        if ts.empty:
            continue
        for metric, what in (("throughput_Bps", "carried"), ("capacity_Bps", "left by background")):
            rows = ts[ts["metric"] == metric]
            for link, part in rows.groupby("entity", observed=True):
                if metric == "throughput_Bps" and not part["value"].any():
                    continue           # a link this run never used
                if metric == "capacity_Bps" and str(link) != "wan":
                    continue
                dash = "dot" if metric == "capacity_Bps" else "solid" if link == "wan" else "dash"
                traces.append({"type": "scatter", "mode": "lines",
                               "line": {"color": _colour(i), "dash": dash, "width": 1.5},
                               "name": f"{run.name}: {link} {what}",
                               "x": _values(part["time_s"] / per),
                               "y": _values(part["value"] * 8 / 1e9),
                               "hovertemplate": f"%{{x:.2f}} {unit}: %{{y:.2f}} Gb/s"})
    if not traces:
        return None
    return {"data": traces, "layout": _layout("link throughput", f"simulated time ({unit})",
                                              "Gb/s")}


# -- plan and sweep figures -----------------------------------------------------------------------
def _plan_points(points: pd.DataFrame) -> tuple[dict[str, list], list[dict]]:
    """A plan's axes and rows (as `Plan.points` has them) from its points table."""
    axis_names = list(points.columns[:list(points.columns).index("point")])
    axes = {k: list(dict.fromkeys(points[k].tolist())) for k in axis_names}
    rows = []
    for rec in points.to_dict(orient="records"):
        row = {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in rec.items()}
        row["values"] = {k: rec[k] for k in axis_names}
        rows.append(row)
    return axes, rows


def plan_heatmap(points: pd.DataFrame) -> dict | None:
    from pddsim.experiments.plan import heatmap_cells
    axes, rows = _plan_points(points)
    if len(axes) < 2 or "outcome" not in points:
        return None
    x, y, grid, text = heatmap_cells(rows, axes)
    return {"data": [{"type": "heatmap", "z": [_values(r) for r in grid],
                      "x": [str(v) for v in axes[x]], "y": [str(v) for v in axes[y]],
                      "text": text, "texttemplate": "%{text}", "colorscale": "Viridis",
                      "colorbar": {"title": {"text": "req/$"}},
                      "hovertemplate": f"{x}=%{{x}}<br>{y}=%{{y}}<br>%{{text}}<extra></extra>"}],
            "layout": _layout("BCR at capacity, req/$ (a cell without one says why)", x, y,
                              xaxis={"type": "category", "title": {"text": x}},
                              yaxis={"type": "category", "title": {"text": y}})}


def plan_pareto(points: pd.DataFrame) -> dict | None:
    if "outcome" not in points:
        return None
    _axes, rows = _plan_points(points)

    def label(r):
        return f"point {r['point']}: " + ", ".join(f"{k}={v}" for k, v in r["values"].items())
    traces = []
    for outcome, key, symbol, name in (("capacity", "capacity_rps", "circle", "measured"),
                                       ("lower bound only", "capacity_lower_bound_rps",
                                        "triangle-up", "capacity not found: at least")):
        mine = [r for r in rows if r["outcome"] == outcome and r.get(key) is not None]
        if mine:
            traces.append({"type": "scatter", "mode": "markers", "name": name,
                           "marker": {"symbol": symbol, "size": 9},
                           "x": [r["cost_per_hour"] for r in mine], "y": [r[key] for r in mine],
                           "text": [label(r) for r in mine],
                           "hovertemplate": "%{text}<br>$%{x:.1f}/h, %{y:.3f} req/s"})
    front = sorted((r for r in rows if r.get("pareto")), key=lambda r: r["cost_per_hour"])
    if front:
        traces.append({"type": "scatter", "mode": "lines+markers", "name": "Pareto front",
                       "x": [r["cost_per_hour"] for r in front],
                       "y": [r["capacity_rps"] for r in front], "text": [label(r) for r in front],
                       "hovertemplate": "%{text}<br>$%{x:.1f}/h, %{y:.3f} req/s"})
    if not traces:
        return None
    return {"data": traces, "layout": _layout("cost against capacity", "cost ($/h)",
                                              "capacity (req/s)")}


SWEEP_METRICS = (("ttft_p90_s", "TTFT P90 (s)"), ("goodput_rps", "goodput (req/s)"),
                 ("slo_attainment", "SLO attainment"), ("cost_per_hour", "cost ($/h)"),
                 ("bcr", "BCR (req/$)"), ("capacity_rps", "capacity (req/s)"))


def sweep_figures(table: pd.DataFrame) -> list[dict]:
    """Each headline metric against the first grid key, one line per value of the others."""
    keys = list(table.columns[:list(table.columns).index("system")])
    if not keys:
        return []
    x, others = keys[0], keys[1:]
    groups = table.groupby(others, sort=False) if others else [((), table)]
    figures = []
    for metric, label in SWEEP_METRICS:
        if metric not in table or table[metric].isna().all():
            continue
        traces = []
        for values, part in groups:
            values = values if isinstance(values, tuple) else (values,)
            name = ", ".join(f"{k}={v}" for k, v in zip(others, values)) or metric
            traces.append({"type": "scatter", "mode": "lines+markers", "name": name,
                           "x": [str(v) for v in part[x]], "y": _values(part[metric]),
                           "hovertemplate": f"{x}=%{{x}}: %{{y:.4g}}"})
        figures.append({"data": traces, "layout": _layout(f"{label} against {x}", x, label)})
    return figures


# -- the page -----------------------------------------------------------------------------------
def _cell(v) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _table(df: pd.DataFrame, **kw) -> str:
    """A table that scrolls sideways when wide; missing values as "-", numbers to 4 figures."""
    shown = df.astype(object).map(_cell)
    return f"<div class='wide'>{shown.to_html(classes='t', border=0, **kw)}</div>"


def provenance_section(produced: dict[str, dict]) -> list[str]:
    """What produced each output, at the top of the page: a table of the essentials and the
    whole record (resolved config included) to unfold."""
    if not produced:
        return ["<h2>What produced it</h2>", "<p class='note'>No provenance was recorded with these "
                "outputs (version, config, trace, seed, command): a pddsim that did not write it "
                "made them.</p>"]

    def essentials(p: dict) -> dict:
        config, trace = p.get("config") or {}, p.get("trace")
        return {"pddsim": p.get("pddsim"), "command": p.get("command"),
                "config": f"{config.get('name')} (sha256 {str(p.get('config_sha256', ''))[:12]})",
                "trace": f"{trace.get('path')} (sha256 {str(trace.get('sha256', ''))[:12]})"
                if isinstance(trace, dict) else "generated",
                "seed": p.get("seed"),
                "catalog": ", ".join(f"{c.get('name')} ({c.get('source')})"
                                     for c in p.get("catalog") or []),
                "date": (p.get("run_info") or {}).get("date")}
    rows = {name: essentials(p) for name, p in produced.items()}
    whole = "".join(f"<details><summary>{html.escape(name)}: the whole record</summary><pre>"
                    f"{html.escape(json.dumps(p, indent=2, default=str))}</pre></details>"
                    for name, p in produced.items())
    return ["<h2>What produced it</h2>", _table(pd.DataFrame(rows)), whole]


def pool_frame(run: Run) -> pd.DataFrame:
    inst = run.table("instances")
    if inst.empty:
        return inst
    cols = [c for c in ("busy_share", "kv_occupancy_mean", "kv_occupancy_p99", "kv_full_share",
                        "memory_blocked_share", "queue_depth_mean", "preemptions") if c in inst]
    return inst.groupby("role")[cols].mean()


class Page:
    """The page's parts, figures numbered as they are added."""

    def __init__(self):
        self.parts: list[str] = []
        self.figures: list[dict] = []

    def add(self, *html_parts: str) -> None:
        self.parts.extend(html_parts)

    def figure(self, spec: dict | None) -> None:
        if spec is not None:
            self.parts.append(f"<div class='fig' id='fig{len(self.figures)}'></div>")
            self.figures.append(spec)

    def render(self, title: str) -> str:
        from plotly.offline import get_plotlyjs
        specs = json.dumps(self.figures).replace("</", "<\\/")
        style = ("body{font-family:sans-serif;max-width:1150px;margin:2em auto;color:#222}"
                 "table.t{border-collapse:collapse;font-size:13px}"
                 "table.t td,table.t th{padding:2px 8px;border-bottom:1px solid #ddd;"
                 "text-align:right;vertical-align:top}"
                 "pre{margin:0;font-size:12px}.fig{margin:1em 0}.note{color:#666}"
                 ".wide{overflow-x:auto}")
        draw = ("const specs = " + specs + ";\nspecs.forEach((s, i) => Plotly.newPlot('fig' + i, "
                "s.data, s.layout, {responsive: true, displaylogo: false}));")
        return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
                f"<title>{html.escape(title)}</title><style>{style}</style>"
                f"<script>{get_plotlyjs()}</script></head><body>"
                f"<h1>{html.escape(title)}</h1>{''.join(self.parts)}<script>{draw}</script>"
                "</body></html>\n")


def run_sections(page: Page, runs: list[Run]) -> None:
    first = runs[0].name
    page.add("<h2>Headline</h2>", "<p class='note'>" + (f"deltas against {html.escape(first)}"
             if len(runs) > 1 else "") + "</p>",
             _table(comparison_frame([{**r.summary, "system": r.name} for r in runs])))
    for run in runs:
        if any(k.startswith("stage_") for k in run.summary):
            page.add(f"<h2>{html.escape(run.name)}: where the time went (s per request)</h2>",
                     _table(stage_table(run.summary)))
    page.add("<h2>TTFT</h2>")
    page.figure(ttft_cdf(runs))
    page.figure(ttft_by_bucket(runs))
    page.add("<h2>Over time</h2>")
    figures = [windows_figure(runs, "ttft_p90_s", "TTFT P90 per arrival window", "TTFT P90 (s)",
                              "slo_ttft_s", "s"),
               windows_figure(runs, "slo_attainment", "SLO attainment per arrival window",
                              "share meeting the SLO", "slo_target", "", percent=True),
               pool_series(runs, "kv_occupancy", "KV memory occupancy per pool", "share of KV pool",
                           percent=True),
               pool_series(runs, "queue_depth", "queue depth per pool", "requests waiting"),
               link_series(runs)]
    if not any(figures):
        page.add("<p class='note'>sampling was off: no time series</p>")
    for spec in figures:
        page.figure(spec)
    for run in runs:
        pools = pool_frame(run)
        if not pools.empty:
            page.add(f"<h2>{html.escape(run.name)}: utilisation per pool</h2>", _table(pools))


def render(runs: list[Run], extra: dict[str, pd.DataFrame], provenance: dict | None = None) -> str:
    """The page; `provenance`: what produced the folder, shown where its runs recorded none."""
    page = Page()
    recorded = {r.name: r.provenance for r in runs if r.provenance}
    page.add(*provenance_section(recorded or ({"outputs": provenance} if provenance else {})))
    if runs:
        run_sections(page, runs)
    for name, table in extra.items():
        page.add(f"<h2>{html.escape(name)}</h2>")
        if "outcome" in table and "point" in table:            # a plan's points
            page.figure(plan_heatmap(table))
            page.figure(plan_pareto(table))
        elif "system" in table:                                 # a sweep's rows
            for spec in sweep_figures(table):
                page.figure(spec)
        page.add(_table(table.head(200), index=False))
    title = "pddsim report: " + (", ".join(r.name for r in runs) or ", ".join(extra))
    return page.render(title)


def write_report(path: str | Path, out: str | Path) -> Path:
    out, path = Path(out), Path(path)
    out.write_text(render(*find_runs(path), sidecar_provenance(path)), encoding="utf-8")
    return out


def diff_runs(a: str | Path, b: str | Path) -> list[Run]:
    """Two saved runs, named apart (by their folders when they are the same system)."""
    runs = []
    for path in (Path(a), Path(b)):
        if not (path / "summary.json").is_file():
            raise InputError(f"{path}: not a run (no summary.json; give what `pddsim run --out` "
                             "wrote)")
        runs.append(Run(path))
    if runs[0].name == runs[1].name:
        for run in runs:
            run.name = f"{run.name} ({run.path.name})"
    return runs


def write_diff(a: str | Path, b: str | Path, out: str | Path | None) -> str:
    """The headline table of run B against run A, and with `out` the report of both."""
    runs = diff_runs(a, b)
    if out is not None:
        Path(out).write_text(render(runs, {}), encoding="utf-8")
    return comparison_frame([{**r.summary, "system": r.name} for r in runs]).to_string()
