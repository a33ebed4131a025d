"""One self-contained HTML page from what `pddsim run --out` wrote: the summary and where the time
went, TTFT distributions and TTFT by prefix-hit bucket, the time series and utilisation per pool.

A directory whose subdirectories are runs (one per system, as `compare --out` writes them) gives
one page comparing them; any other table found beside the runs (a plan's points, say) is shown as
it is. Figures are inline SVG and the page loads nothing from the network, so it can be mailed or
archived as one file.
"""
from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from pddsim.errors import InputError
from pddsim.metrics import by_bucket, headline, stage_table
from pddsim.sim import RUN_TABLES


class Run:
    """The tables of one run directory."""

    def __init__(self, path: Path):
        self.path = path
        self.summary = json.loads((path / "summary.json").read_text())
        self.provenance = _read_provenance(path)
        self.name = str(self.summary.get("system") or path.name)
        self.tables = {}
        for name in RUN_TABLES:
            self.tables[name] = _read_table(path, name)

    def table(self, name: str) -> pd.DataFrame:
        return self.tables.get(name) if self.tables.get(name) is not None else pd.DataFrame()


def _read_provenance(folder: Path) -> dict | None:
    """What produced the folder's outputs (`provenance.json`; None in one written before it)."""
    path = folder / "provenance.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not valid JSON ({e})") from None


def provenance_section(produced: dict[str, dict]) -> list[str]:
    """What produced each output, at the top of the page: a table of the essentials and the
    whole record (resolved config included) to unfold."""
    if not produced:
        return []
    rows = {name: {"pddsim": p.get("pddsim"), "command": p.get("command"),
                   "config": f"{p['config'].get('name')} (sha256 {p.get('config_sha256', '')[:12]})",
                   "trace": "generated" if not p.get("trace") else
                   f"{p['trace']['path']} (sha256 {p['trace']['sha256'][:12]})",
                   "seed": p.get("seed"),
                   "catalog": ", ".join(f"{c['name']} ({c['source']})" for c in p.get("catalog", [])),
                   "date": p.get("run_info", {}).get("date")}
            for name, p in produced.items()}
    whole = "".join(f"<details><summary>{html.escape(name)}: the whole record</summary><pre>"
                    f"{html.escape(json.dumps(p, indent=2))}</pre></details>"
                    for name, p in produced.items())
    return ["<h2>What produced it</h2>", _table(pd.DataFrame(rows)), whole]


def _read_table(folder: Path, name: str) -> pd.DataFrame | None:
    for suffix, read in ((".parquet", pd.read_parquet), (".csv", pd.read_csv),
                         (".jsonl", lambda p: pd.read_json(p, lines=True))):
        path = folder / f"{name}{suffix}"
        if path.is_file():
            try:
                return read(path)
            except (ValueError, OSError) as e:
                raise InputError(f"{path}: cannot read table ({e})") from None
    return None


def find_runs(folder: Path) -> tuple[list[Run], dict[str, pd.DataFrame], list[Path]]:
    """The runs in `folder` (itself, or its subfolders), any other tables lying there (a plan's
    points) and the PNG figures beside them (a plan's heatmap and Pareto front)."""
    if not folder.is_dir():
        raise InputError(f"{folder}: not a directory (give what `pddsim run --out` wrote)")
    try:
        if (folder / "summary.json").is_file():
            runs = [Run(folder)]
        else:
            runs = [Run(p) for p in sorted(folder.iterdir()) if (p / "summary.json").is_file()]
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{folder}: a summary.json is not valid JSON ({e})") from None
    extra = {}
    for path in sorted(folder.glob("*.parquet")):
        if path.stem not in RUN_TABLES:
            extra[path.stem] = pd.read_parquet(path)
    images = sorted(folder.glob("*.png"))
    if not runs and not extra:
        raise InputError(f"{folder}: no summary.json here or in its subfolders and no table "
                         "(give what `pddsim run --out`, `compare --out` or `plan --out` wrote)")
    return runs, extra, images


# -- figures ------------------------------------------------------------------------------------
def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg"):]          # drop the XML prolog: the SVG sits inline


def _figure(width=7.0, height=3.2):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height))
    return fig, fig.add_subplot()


def ttft_cdf(runs: list[Run]) -> str:
    fig, ax = _figure()
    for run in runs:
        df = run.table("requests")
        if "ttft_s" not in df:
            continue
        values = np.sort(df.loc[df["status"] == "completed", "ttft_s"].dropna().to_numpy())
        if len(values):
            ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post",
                    label=run.name)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("share of requests")
    ax.set_title("TTFT distribution")
    ax.grid(alpha=0.3)
    ax.legend()
    return _svg(fig)


def ttft_by_bucket(runs: list[Run]) -> str:
    fig, ax = _figure()
    width = 0.8 / max(len(runs), 1)
    for i, run in enumerate(runs):
        df = run.table("requests")
        if "hit_bucket" not in df:
            continue
        table = by_bucket(df.assign(hit_bucket=pd.Categorical(df["hit_bucket"])))
        x = np.arange(len(table))
        ax.bar(x + i * width, table["ttft_p90_s"].fillna(0), width, label=f"{run.name} P90")
        ax.set_xticks(x + width * (len(runs) - 1) / 2, [str(b) for b in table.index])
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_xlabel("prefix hit rate bucket (%)")
    ax.set_ylabel("TTFT P90 (s)")
    ax.set_title("TTFT by prefix-hit bucket")
    ax.legend()
    return _svg(fig)


def series_figure(run: Run, metric: str, title: str, ylabel: str, roles=None) -> str | None:
    ts = run.table("timeseries")
    if ts.empty:
        return None
    rows = ts[ts["metric"] == metric]
    if roles is not None:
        rows = rows[rows["entity"].astype(str).isin(roles)]
    if rows.empty:
        return None
    fig, ax = _figure()
    for entity, part in rows.groupby("entity", observed=True):
        ax.plot(part["time_s"], part["value"], label=str(entity), linewidth=1)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{run.name}: {title}")
    ax.grid(alpha=0.3)
    if rows["entity"].nunique() <= 12:
        ax.legend(fontsize="small")
    return _svg(fig)


def window_figure(run: Run) -> str | None:
    w = run.table("windows")
    if w.empty:
        return None
    w = w[w["bucket"] == "all"]
    fig, ax = _figure()
    ax.plot(w["window_start_s"], w["ttft_p50_s"], label="TTFT P50")
    ax.plot(w["window_start_s"], w["ttft_p90_s"], label="TTFT P90")
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_xlabel("arrival window start (s)")
    ax.set_ylabel("TTFT (s)")
    right = ax.twinx()
    right.plot(w["window_start_s"], w["slo_attainment"], color="black", linestyle=":",
               label="SLO attainment")
    right.set_ylim(0, 1.05)
    right.set_ylabel("SLO attainment")
    ax.set_title(f"{run.name}: latency per arrival window")
    ax.legend(loc="upper left")
    return _svg(fig)


# -- the page -----------------------------------------------------------------------------------
def _table(df: pd.DataFrame, **kw) -> str:
    return df.to_html(classes="t", border=0, float_format=lambda v: f"{v:.4g}", **kw)


def summary_frame(runs: list[Run]) -> pd.DataFrame:
    return pd.DataFrame({run.name: headline(run.summary) for run in runs})


def pool_frame(run: Run) -> pd.DataFrame:
    inst = run.table("instances")
    if inst.empty:
        return inst
    cols = [c for c in ("busy_share", "kv_occupancy_mean", "kv_occupancy_p99", "kv_full_share",
                        "memory_blocked_share", "queue_depth_mean", "preemptions") if c in inst]
    return inst.groupby("role")[cols].mean()


def _inline_png(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f"<figure><img alt='{html.escape(path.stem)}' src='data:image/png;base64,{data}'></figure>"


def render(runs: list[Run], extra: dict[str, pd.DataFrame], images: Sequence[Path] = (),
           produced: dict | None = None) -> str:
    """The page; `produced`: the folder's own provenance (a plan's), shown when no run has one."""
    title = ", ".join(r.name for r in runs) or ", ".join(extra)
    parts = [f"<h1>pddsim report: {html.escape(title)}</h1>"]
    parts += provenance_section({r.name: r.provenance for r in runs if r.provenance is not None}
                                or ({title: produced} if produced else {}))
    if runs:
        parts += ["<h2>Summary</h2>", _table(summary_frame(runs))]
        parts += run_sections(runs)
    for name, table in extra.items():
        parts += [f"<h2>{html.escape(name)}</h2>", _table(table.head(200), index=False)]
    parts += [_inline_png(path) for path in images]
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
             "table.t{border-collapse:collapse;font-size:13px}"
             "table.t td,table.t th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}"
             "figure{margin:1em 0}figure svg,figure img{max-width:100%;height:auto}")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>pddsim report</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")


def run_sections(runs: list[Run]) -> list[str]:
    """Stage tables, TTFT figures, time series and utilisation of the runs."""
    parts = []
    for run in runs:
        if any(k.startswith("stage_") for k in run.summary):
            parts += [f"<h2>{html.escape(run.name)}: where the time went (s per request)</h2>",
                      _table(stage_table(run.summary))]
    parts += ["<h2>TTFT</h2>", f"<figure>{ttft_cdf(runs)}</figure>",
              f"<figure>{ttft_by_bucket(runs)}</figure>"]
    for run in runs:
        figures = [window_figure(run),
                   series_figure(run, "kv_occupancy", "KV memory occupancy", "share of KV pool"),
                   series_figure(run, "queue_depth", "queue depth", "requests waiting"),
                   series_figure(run, "throughput_Bps", "link throughput", "bytes/s")]
        figures = [f for f in figures if f is not None]
        parts.append(f"<h2>{html.escape(run.name)}: over time</h2>")
        parts += [f"<figure>{f}</figure>" for f in figures] or ["<p>sampling was off</p>"]
        pools = pool_frame(run)
        if not pools.empty:
            parts += [f"<h2>{html.escape(run.name)}: utilisation per pool</h2>", _table(pools)]
    return parts


def write_report(folder: str | Path, out: str | Path) -> Path:
    out = Path(out)
    out.write_text(render(*find_runs(Path(folder)), _read_provenance(Path(folder))), encoding="utf-8")
    return out
