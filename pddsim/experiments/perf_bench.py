"""Predicted against measured iteration times: `pddsim bench perf --against MEASURED.csv`.

The measured file has one row per timed iteration: `model,gpu,tp,tokens,attn_pairs,kv_tokens,
time_ms,source` and optionally `decode_pairs`, which tells prefill, decode and mixed iterations
apart (without it, a decode is an iteration whose tokens each attend to their own context, so
`attn_pairs == kv_tokens`, and anything else a prefill). Each row is predicted by the roofline under
every engine profile, and by each measured table given for the rows of its own model, GPU and
TP; the report gives the median absolute error by kind and TP, and the median predicted/measured
ratio by kind and TP (a ratio drifting with TP means a cost that does not scale like the model
assumes), pooled and per source; each source is marked as the one the profile was fitted to (or
the table imported from) or as held out, and rows a table cannot price are counted, not dropped.
"""
from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pddsim import catalog
from pddsim.config import Perf, parse_override
from pddsim.engine.perf import MeasuredTable, Roofline
from pddsim.errors import InputError
from pddsim.schema import validated

COLUMNS = ("model", "gpu", "tp", "tokens", "attn_pairs", "kv_tokens", "time_ms", "source")
OPTIONAL = ("decode_pairs",)


def read_measured(path: Path) -> pd.DataFrame:
    """The measured points, each checked: a bad line names the file and line.

    The optional `decode_pairs` column gives the attention pairs of the iteration's decode tokens,
    so that a mixed iteration (prefill chunks and decodes together) can be told apart: 0 for a
    prefill, `attn_pairs` for a decode, in between for a mixed one. Left out or blank, a row is a
    decode when each token attends exactly the KV it reads (`attn_pairs == kv_tokens`), else a
    prefill."""
    rows = []
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            fields = reader.fieldnames or []
            missing = [c for c in COLUMNS if c not in fields]
            unknown = [c for c in fields if c not in COLUMNS + OPTIONAL]
            problems = []
            if missing:
                problems.append(f"missing column(s) {', '.join(missing)}")
            if unknown:
                problems.append(f"unknown column(s) {', '.join(unknown)} (known: "
                                f"{', '.join(COLUMNS + OPTIONAL)})")
            if problems:
                raise InputError(f"{path}: {'; '.join(problems)}")
            for line, r in enumerate(reader, start=2):
                if None in r or None in r.values():
                    raise InputError(f"{path}:{line}: not the header's {len(fields)} fields")
                try:
                    row: dict[str, Any] = {
                           "model": catalog.model(r["model"]).name, "gpu": catalog.gpu(r["gpu"]).name,
                           "tp": int(r["tp"]), "tokens": float(r["tokens"]),
                           "attn_pairs": float(r["attn_pairs"]), "kv_tokens": float(r["kv_tokens"]),
                           "time_ms": float(r["time_ms"]), "source": r["source"]}
                    given = (r.get("decode_pairs") or "").strip()
                    row["decode_pairs"] = float(given) if given else (
                        row["attn_pairs"] if row["attn_pairs"] == row["kv_tokens"] else 0.0)
                except (ValueError, TypeError, InputError) as e:
                    raise InputError(f"{path}:{line}: {e}") from None
                if row["tp"] < 1 or row["tokens"] < 1 or row["time_ms"] <= 0 \
                        or min(row["attn_pairs"], row["kv_tokens"]) < 0 \
                        or not 0 <= row["decode_pairs"] <= row["attn_pairs"]:
                    raise InputError(f"{path}:{line}: tp and tokens must be >= 1, time_ms > 0, "
                                     "attn_pairs and kv_tokens >= 0, decode_pairs within 0-attn_pairs")
                rows.append(row)
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    if not rows:
        raise InputError(f"{path}: no measured points")
    df = pd.DataFrame(rows)
    decode, pairs = df["decode_pairs"], df["attn_pairs"]
    df["kind"] = np.select([decode == pairs, decode == 0], ["decode", "prefill"], "mixed")
    return df


def predict(df: pd.DataFrame, perf_model_of) -> np.ndarray:
    """Predicted milliseconds per row; `perf_model_of(model, gpu, tp)` gives the model to ask, or
    None when it has none for them. Rows without a model, and rows outside a measured table's
    grids, get NaN: no prediction, counted by `summarise` as not covered."""
    out = np.full(len(df), np.nan)
    for (model, gpu, tp), idx in df.groupby(["model", "gpu", "tp"]).indices.items():
        perf = perf_model_of(model, gpu, int(tp))
        if perf is None:
            continue
        part = df.iloc[idx]
        work = tuple(part[c].to_numpy() for c in ("tokens", "attn_pairs", "kv_tokens", "decode_pairs"))
        if isinstance(perf, MeasuredTable):
            covered = perf.covers(*work)
            idx, work = idx[covered], tuple(w[covered] for w in work)
        if len(idx):
            out[idx] = 1e3 * perf.iterations(*work)
    return out


def profile_with(name: str, settings: Sequence[str]) -> catalog.EngineProfile:
    """Profile `name` with `FIELD=VALUE` settings of its constants, validated as a config's
    `perf.FIELD` overrides (what-if: how would the report read with another constant?). It keeps
    the source it was fitted to: its other constants still come from that fit."""
    overrides = dict(parse_override(s) for s in settings)
    constants = set(catalog.EngineProfile.model_fields) - {"name", "fitted_to"}
    for key in overrides:
        if key not in constants:
            raise InputError(f"--set {key}: not an engine constant (one of {', '.join(sorted(constants))})")
    return validated(Perf, {"engine": name, **overrides}, "--set").engine_profile()


def roofline_of(profile: catalog.EngineProfile):
    return lambda model, gpu, tp: Roofline(catalog.model(model), catalog.gpu(gpu), tp, profile)


def table_of(path: Path) -> tuple[Any, str]:
    """A measured table as a predictor of the cases of its own model, GPU and TP, and the source it
    was imported from, both read from the provenance sidecar `pddsim perf import` writes beside
    it; it predicts no other case."""
    sidecar = Path(str(path) + ".provenance.json")
    try:
        provenance = json.loads(sidecar.read_text())
        own = (catalog.model(provenance["model"]).name, catalog.gpu(provenance["gpu"]).name,
               int(provenance["tp"]))
        source = str(provenance["source"])
    except OSError:
        raise InputError(f"{path}: no {sidecar.name} beside it to name the table's model, GPU and "
                         "TP (`pddsim perf import` writes one)") from None
    except (ValueError, TypeError, KeyError, InputError) as e:
        raise InputError(f"{sidecar}: needs source, model, gpu and tp ({e})") from None
    table = MeasuredTable(path)
    return (lambda model, gpu, tp: table if (model, gpu, tp) == own else None), source


def compare(df: pd.DataFrame, predictors: dict, fitted_to: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per measured point and predictor: predicted, ratio, absolute % error, and whether
    the point's source is the one the predictor was fitted to (`fitted_to`: predictor -> source
    prefix) or held out from its fit."""
    parts = []
    for name, perf_model_of in predictors.items():
        part = df.copy()
        part["predictor"] = name
        part["predicted_ms"] = predict(df, perf_model_of)
        part["ratio"] = part["predicted_ms"] / part["time_ms"]
        part["abs_err_pct"] = 100 * (part["ratio"] - 1).abs()
        prefix = (fitted_to or {}).get(name, "").lower()
        part["fit"] = np.where(part["source"].str.lower().str.startswith(prefix) if prefix
                               else False, "fitted", "held out")
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def _ratios(part: pd.DataFrame) -> dict:
    """Median predicted/measured by kind and TP (a ratio drifting with TP is a mis-scaled cost)."""
    return {f"{kind} tp{int(tp)}": round(float(v), 2)
            for (kind, tp), v in part.groupby(["kind", "tp"])["ratio"].median().items()}


def summarise(cases: pd.DataFrame) -> dict:
    """Per predictor: median absolute % error by kind and TP, the median ratio by kind and TP
    pooled over every source, and both again per source, marked fitted or held out (a
    predictor's figures on the source it was fitted to are no evidence of its accuracy)."""
    out = {}
    for name, every in cases.groupby("predictor", sort=False):
        part = every[every["predicted_ms"].notna()]
        out[name] = {
            "cases": int(len(part)),
            "not_covered": int(len(every) - len(part)),
            "median_abs_err_pct": {
                "by_kind": part.groupby("kind")["abs_err_pct"].median().round(1).to_dict(),
                "by_tp": {int(k): v for k, v in
                          part.groupby("tp")["abs_err_pct"].median().round(1).items()}},
            "median_ratio": _ratios(part),
            "by_source": {src: {"fit": g["fit"].iloc[0],
                                "median_abs_err_pct": {
                                    "all": round(float(g["abs_err_pct"].median()), 1),
                                    **g.groupby("kind")["abs_err_pct"].median().round(1).to_dict()},
                                "median_ratio": _ratios(g)}
                          for src, g in part.groupby("source")},
        }
    return out


def format_report(summary: dict) -> str:
    def listed(d, fmt):
        return ", ".join(f"{k} {fmt.format(v)}" for k, v in d.items())

    lines = []
    for name, s in summary.items():
        err = s["median_abs_err_pct"]
        uncovered = f", {s['not_covered']} not covered" if s["not_covered"] else ""
        lines.append(f"{name} ({s['cases']} cases{uncovered}): median |error| "
                     + listed(err["by_kind"], "{:.1f}%"))
        lines.append("  by TP: " + listed({f"tp{k}": v for k, v in err["by_tp"].items()}, "{:.1f}%"))
        lines.append("  predicted/measured, pooled: " + listed(s["median_ratio"], "{:.2f}"))
        for src, v in s["by_source"].items():
            lines.append(f"  {src} ({v['fit']}): median |error| "
                         + listed(v["median_abs_err_pct"], "{:.1f}%"))
            lines.append("    predicted/measured: " + listed(v["median_ratio"], "{:.2f}"))
    return "\n".join(lines)
