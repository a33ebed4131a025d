"""Whole serving benchmarks of real engines, replayed: `pddsim bench serve --against FILE.csv`.

The measured file is in the format of NVIDIA aiconfigurator's silicon sample (its own column names):
one row per deployment of a model on a GPU type by an engine (`backend`), aggregated (`agg`: one
worker serving prefill and decode) or disaggregated (`disagg`: prefill and decode workers), with
its parallel layout (tensor, attention data and expert parallelism), its quantisation, and the
benchmark that measured it: `silicon_concurrency=N` clients inside `silicon_data_source`, fixed
input and output lengths (`isl`, `osl`), the mean TTFT and TPOT measured.

Each row the catalogs can represent becomes a scenario (`scenario`) and is replayed as the
benchmark that produced it: N closed-loop clients (`workload.synthetic.kind: benchmark`), a
warm-up of 2N requests drained before the measured phase, which then starts with every client at
once, as aiperf's benchmark scripts run it. The measured phase is `rounds` x N requests (ROUNDS
says why 10), every one simulated: the load takes many rounds to settle (jittered clients drift
out of the cohorts the first burst forms), so no round stands for the others. Rows that cannot be
represented are counted by reason, never dropped.

The report gives the median absolute % error and the median predicted/measured ratio of mean TTFT
and mean TPOT, overall and by model, GPU, backend, agg/disagg and concurrency band, beside the
noise floor of the rows measured more than once.
"""
from __future__ import annotations

import csv
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from pddsim import catalog
from pddsim.config import ENGINE_BATCHING, Config, from_dict
from pddsim.errors import InputError

# the source's names for what the catalogs call otherwise
MODELS = {
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b", "meta-llama/Llama-3.1-8B": "llama-3.1-8b",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3", "deepseek-ai/DeepSeek-R1": "deepseek-v3",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-v3", "nvidia/DeepSeek-V3.1-NVFP4": "deepseek-v3",
    "deepseek-ai/DeepSeek-V3.1": "deepseek-v3", "nvidia/DeepSeek-R1-FP4": "deepseek-v3",
    "Qwen/Qwen3-32B": "qwen3-32b", "nvidia/Qwen3-32B-NVFP4": "qwen3-32b", "Qwen/Qwen3-32B-FP8": "qwen3-32b",
    "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B": "qwen3-235b-a22b",
    "Qwen/Qwen3.5-397B-A17B": "qwen3.5-397b-a17b", "openai/gpt-oss-120b": "gpt-oss-120b",
    "MiniMaxAI/MiniMax-M2.5": "minimax-m2.5", "zhipuai/GLM-5": "glm-5", "zai-org/GLM-5": "glm-5",
    "moonshotai/Kimi-K2.5": "kimi-k2.5",
}
SYSTEMS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200", "b300_sxm": "b300",
           "gb200": "gb200", "gb300": "gb300", "a100_sxm": "a100-80gb"}
QUANT = {"fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4", "mxfp4": "mxfp4", "w4a16": "int4",
         "int4": "int4", "int4_wo": "int4", "bf16": "bf16", "fp16": "fp16", "float16": "fp16"}
REQUIRED = ("model_path", "system", "backend", "mode", "isl", "osl", "silicon_data_source",
            "silicon_ttft_ms", "silicon_tpot_ms")
LAYOUT = ("num_workers", "batch_size", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size",
          "moe_ep_size")
BANDS = ((1, 8, "1-8"), (9, 64, "9-64"), (65, 10**9, "65+"))
GROUPS = ("model", "gpu", "backend", "mode", "band")
# Measured requests per client. FITTED: aiconfigurator's benchmark template sends 50 x concurrency
# requests, but the fit rows' TTFTs rise with concurrency as a measured phase of ~10 rounds
# does (its first round is a burst of every client at once); of 5, 10, 20 and 50, 10 explains
# them best.
ROUNDS = 10


def read_rows(path) -> pd.DataFrame:
    """The file's rows with the columns a replay needs, checked: a missing column or a line with
    another number of fields than the header is one error naming the file (and line)."""
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise InputError(f"{path}: empty file")
            missing = [c for c in REQUIRED if c not in header]
            if missing:
                raise InputError(f"{path}: missing column(s) {', '.join(missing)} (an aiconfigurator "
                                 "silicon-sample file has them)")
            rows = []
            for line, fields in enumerate(reader, start=2):
                if len(fields) != len(header):
                    raise InputError(f"{path}:{line}: {len(fields)} fields, the header has {len(header)}")
                rows.append(fields)
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start})") from None
    df = pd.DataFrame(rows, columns=header)
    df.insert(0, "line", np.arange(2, len(df) + 2))
    return df


def _number(row: dict, key: str) -> float | None:
    text = str(row.get(key, "") or "").strip()
    if not text or text.lower() == "nan":
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{key}={text!r} is not a number") from None
    return value if np.isfinite(value) else None


def _layout(row: dict, prefix: str, model: catalog.ModelSpec, clients: int = 0) -> dict:
    """A worker's layout: `tp` GPUs per attention rank, `dp` ranks, experts over `ep` (0 or
    blank: 1), and its batch cap (the source gives it per attention rank).

    An aggregated worker of `clients` clients whose attention_dp_size is blank and whose batch
    cap times its tensor parallelism is the concurrency is read as attention data parallelism
    over its GPUs (TensorRT-LLM's enable_attention_dp recorded without a DP size, the cap per
    rank): read as one tensor-parallel rank, the cap would queue clients where the measured TTFT
    shows none.

    An MLA model (one KV head) recorded at a tensor parallelism past one node (`tp_size` > 8,
    no attention DP) is read as attention data parallelism over those GPUs with the experts
    spread over all of them (wide EP), its batch cap the worker's: tensor-parallel MLA would
    replicate the latent KV on every GPU, and the source's batch sizes equal its concurrency
    there.

    A worker recorded as ep x ep GPUs with its experts in ep groups of MoE tensor parallelism ep
    (attention_dp_size given, moe_tp_size = moe_ep_size = ep > 1, tp_size x attention_dp_size =
    ep^2) is read as the expert-parallel worker of ep GPUs it was: one export of the source
    multiplies the attention size (and divides the per-rank batch) by ep, as the 55 of its
    measurements that the source also holds from another export, laid out over ep GPUs (the
    engines' `--tp ep --ep ep`), show."""
    get = {k: _number(row, prefix + k) for k in LAYOUT}
    tp, dp = int(get["tp_size"] or 1), int(get["attention_dp_size"] or 1)
    ep = int(get["moe_ep_size"] or 1)
    moe_tp = int(get["moe_tp_size"] or 1)
    if (get["pp_size"] or 1) > 1:
        raise _Skip("pipeline parallelism is not modelled")
    per_rank = int(get["batch_size"] or 0)
    if get["attention_dp_size"] is not None and moe_tp == ep > 1 and tp * dp == ep * ep:
        if dp > 1:
            dp, per_rank = dp // ep, per_rank * ep
        else:
            tp //= ep
        moe_tp = 1
    if model.experts and (get["moe_ep_size"] or get["moe_tp_size"]) and moe_tp * ep != tp * dp:
        raise _Skip("MoE layout does not cover the worker's GPUs (moe_tp x moe_ep != tp x dp)")
    if get["attention_dp_size"] is None and tp > 1 and clients == per_rank * tp != per_rank:
        tp, dp = 1, tp
    batch = per_rank * dp
    if model.kv_heads == 1 and tp > 8 and dp == 1:
        tp, dp, ep, batch = 1, tp, tp, per_rank
    out = {"tp": tp, "dp": dp, "ep": ep if model.experts else 1, "count": int(get["num_workers"] or 1)}
    if batch:
        out["max_batch"] = batch
    return out


class _Skip(Exception):
    """A row the simulator cannot represent, with the reason it is counted under."""


def _concurrency_text(row: dict) -> str:
    found = re.search(r"silicon_concurrency=(\d+)", str(row.get("silicon_data_source", "")))
    return found.group(1) if found else ""


def concurrency(row: dict) -> int:
    found = _concurrency_text(row)
    if not found:
        raise _Skip("no silicon_concurrency in silicon_data_source")
    return int(found)


def profile(row: dict) -> str:
    """The engine profile a row is replayed under: the one named for its backend and version
    (`trtllm-1.0` for TensorRT-LLM 1.0.x) where the catalog has one, else its backend's. A version's
    benchmarks may have run the engine otherwise than the others (engines.yaml says how)."""
    backend = str(row["backend"])
    version = re.match(r"\d+\.\d+", str(row.get("backend_version", "")).strip())
    named = f"{backend}-{version.group(0)}" if version else ""
    return named if named in catalog.engines() else backend


def scenario(row: dict, engine: str | None = None, overrides: dict | None = None,
             rounds: int = ROUNDS) -> Config:
    """The deployment and benchmark a measured row describes, under `engine` (default: the
    row's own, `profile`) with `overrides` of its constants. Raises _Skip for a row the catalogs
    or the layout rules cannot represent."""
    model = MODELS.get(str(row["model_path"]))
    if model is None or model not in catalog.models():
        raise _Skip(f"model not in the catalog: {row['model_path']}")
    gpu = SYSTEMS.get(str(row["system"]))
    if gpu is None or gpu not in catalog.gpus():
        raise _Skip(f"GPU not in the catalog: {row['system']}")
    engine = engine or profile(row)
    if engine not in catalog.engines():
        raise _Skip(f"no engine profile for backend {row['backend']}")
    try:
        isl, osl = int(_number(row, "isl") or 0), int(_number(row, "osl") or 0)
    except ValueError as e:
        raise _Skip(str(e)) from None
    if isl < 1 or osl < 1:
        raise _Skip("isl and osl must be at least 1")
    n = concurrency(row)
    weights = QUANT.get(str(row.get("gemm_quant_mode", "")).strip().lower())
    experts = QUANT.get(str(row.get("moe_quant_mode", "")).strip().lower()) or weights
    # FP8 and FP4 deployments keep their KV in FP8 (the engines' default for quantised
    # checkpoints); 16-bit ones in 16 bits
    kv = "fp8" if weights in ("fp8", "fp4", "mxfp4") else None
    spec = catalog.model(model)
    if spec.expert_dtype == "mxfp4" and weights == "fp4":
        # a model released only with MXFP4 experts and 16-bit other weights (gpt-oss): the row's
        # FP4 label names that checkpoint, which the engines serve as it is
        weights, experts = None, None
    mode = str(row["mode"]).strip()
    if mode == "agg":
        worker = _layout(row, "", spec, n)
        cap = worker.get("max_batch", n)
        # a cap that divides the concurrency it is below: that many workers behind the router,
        # each at its cap (the measured TTFTs of such rows show no clients queued behind a cap)
        groups = [{"role": "colocated", **worker, "count": n // cap if n > cap and n % cap == 0 else 1}]
    elif mode == "disagg":
        try:
            counted = all(_number(row, f"{side}_num_workers") for side in ("prefill", "decode"))
        except ValueError as e:
            raise _Skip(str(e)) from None
        if not counted:           # a fleet of unknown size: its load per worker is unknown
            raise _Skip("disagg row without prefill and decode worker counts")
        groups = [{"role": "prefill", **_layout(row, "prefill_", spec)},
                  {"role": "decode", **_layout(row, "decode_", spec)}]
    else:
        raise _Skip(f"mode {mode!r} is neither agg nor disagg")
    raw: dict[str, Any] = {
        "name": f"{row['model_path']} {row['system']} {row['backend']} {mode}",
        "model": model,
        "quant": {"weights": weights, "experts": experts if spec.experts else None,
                  "kv": kv},
        "clusters": {"a": {"gpu": gpu, "instances": groups}},
        "slo": {"ttft_s": 1e9, "tpot_s": 1e9},
        "perf": {"engine": engine, **{k: v for k, v in (overrides or {}).items()
                                      if k not in ENGINE_BATCHING}},
        "batching": {k: v for k, v in (overrides or {}).items() if k in ENGINE_BATCHING},
        "observe": {"sample_s": 0},
        "workload": {"synthetic": {"kind": "benchmark", "knobs": {
            "concurrency": n, "isl": isl, "osl": osl, "requests": rounds * n}}},
    }
    return from_dict(raw, f"line {row.get('line', '?')}")


def replay(row: dict, engine: str | None = None, overrides: dict | None = None,
           rounds: int = ROUNDS) -> tuple[float, float]:
    """Predicted mean TTFT and mean TPOT (ms) of a row's measured phase of `rounds` rounds."""
    from pddsim.sim import load_workload, simulate
    cfg = scenario(row, engine, overrides, rounds)
    result = simulate(cfg, load_workload(cfg))
    done = result.requests[~result.requests["warmup"]]
    if (done["status"] != "completed").any():
        raise _Skip(f"requests failed in the replay: {done['failure'].iloc[0]}")
    return 1e3 * float(done["ttft_s"].mean()), 1e3 * float(done["tpot_s"].mean())


def _case(shared: tuple, row: dict) -> dict:
    """One row replayed (a backend's work item): its prediction, or the reason it was skipped."""
    engine, overrides, rounds = shared
    try:
        ttft, tpot = replay(row, engine, overrides, rounds)
        return {"predicted_ttft_ms": ttft, "predicted_tpot_ms": tpot, "skipped": ""}
    except _Skip as e:
        return {"skipped": str(e)}
    except InputError as e:           # a deployment the catalogs refuse (weights do not fit...)
        return {"skipped": "does not fit: " + str(e).split(": ", 1)[-1]}


def band(n: int) -> str:
    return next(label for lo, hi, label in BANDS if lo <= n <= hi)


def cases(rows: pd.DataFrame, backend, engine: str | None = None, overrides: dict | None = None,
          rounds: int = ROUNDS, on_done: Callable[[int], None] | None = None) -> pd.DataFrame:
    """Every row with its prediction (or its skip reason) and errors. Rows that describe the same
    deployment and benchmark under the same engine profile (the file repeats many measurements)
    are replayed once: a replay reads nothing else of a row, so theirs would be the same.
    `on_done(n)`: a replay ended that stands for n rows."""
    items = rows.to_dict("records")
    keys = [k for k in DEPLOYMENT if k in rows.columns]
    first: dict[tuple, int] = {}          # a deployment and benchmark -> its replay
    unique: list[dict] = []
    slot = []
    clients = [_concurrency_text(item) for item in items]
    engines = [engine or profile(item) for item in items]
    for item, n, name in zip(items, clients, engines):
        key = (*(str(item[k]) for k in keys), n, name)
        if key not in first:
            first[key] = len(unique)
            unique.append(item)
        slot.append(first[key])
    stands_for = np.bincount(slot, minlength=len(unique))
    done = None if on_done is None else (lambda u, _r: on_done(int(stands_for[u])))
    results = backend.map(_case, unique, (engine, overrides, rounds), done)
    out = rows.copy()
    extra = pd.DataFrame([results[u] if isinstance(results[u], dict)
                          else {"skipped": f"failed: {results[u].reason}"} for u in slot],
                         index=out.index)
    for column in ("predicted_ttft_ms", "predicted_tpot_ms", "skipped"):
        out[column] = extra[column] if column in extra else np.nan
    out["skipped"] = out["skipped"].fillna("")
    out["engine"] = engines
    out["model"] = [MODELS.get(m, m) for m in out["model_path"]]
    out["gpu"] = [SYSTEMS.get(s, s) for s in out["system"]]
    out["concurrency"] = [int(n or 0) for n in clients]
    out["band"] = [band(n) if n else "" for n in out["concurrency"]]
    for what in ("ttft", "tpot"):
        measured = pd.to_numeric(out[f"silicon_{what}_ms"], errors="coerce")
        out[f"{what}_ratio"] = out[f"predicted_{what}_ms"] / measured
        out[f"{what}_abs_err_pct"] = 100 * (out[f"{what}_ratio"] - 1).abs()
    return out


def _figures(part: pd.DataFrame) -> dict:
    return {"rows": int(len(part)),
            "ttft_mdape_pct": round(float(part["ttft_abs_err_pct"].median()), 1),
            "tpot_mdape_pct": round(float(part["tpot_abs_err_pct"].median()), 1),
            "ttft_median_ratio": round(float(part["ttft_ratio"].median()), 3),
            "tpot_median_ratio": round(float(part["tpot_ratio"].median()), 3)}


DEPLOYMENT = ("model_path", "system", "backend", "mode", "isl", "osl", "gemm_quant_mode",
              "moe_quant_mode", "concurrency") + tuple(
    p + k for p in ("", "prefill_", "decode_") for k in LAYOUT)


# one deployment at every concurrency it was measured at (the source's batch caps follow the clients)
SERIES = tuple(k for k in DEPLOYMENT if k != "concurrency" and not k.endswith("batch_size"))


def noise_floor(df: pd.DataFrame) -> dict:
    """How far repeated measurements of one deployment lie from their median: the median
    absolute % deviation over the rows of deployments measured more than once. A figure another
    row of its deployment repeats exactly is one measurement listed twice, not a repeat: it
    counts once (the file lists 590 such rows)."""
    keys = [k for k in DEPLOYMENT if k in df.columns]
    out: dict[str, Any] = {}
    for what in ("ttft", "tpot"):
        values = pd.to_numeric(df[f"silicon_{what}_ms"], errors="coerce").rename("_measured")
        distinct = pd.concat([df[keys], values], axis=1).drop_duplicates()
        by = [distinct[k].astype(str) for k in keys]
        medians = distinct["_measured"].groupby(by).transform("median")
        repeated = distinct["_measured"].groupby(by).transform("size") > 1
        deviation = (100 * (distinct["_measured"] / medians - 1).abs())[repeated]
        out[f"{what}_repeat_mdape_pct"] = round(float(deviation.median()), 1) if repeated.any() else None
        out[f"{what}_repeated_rows"] = int(repeated.sum())
    out["repeated_rows"] = out["ttft_repeated_rows"]
    return out


def smoothness_floor(df: pd.DataFrame) -> dict:
    """How far each measurement lies from its neighbours in concurrency: for every deployment
    measured at three or more concurrencies (repeats at their median), each inner one against
    the straight line in log-log through the concurrencies on either side of it; the median
    absolute % miss over those rows. It is the measurements' own scatter from one concurrency
    to the next, which no model smooth in the number of clients can follow."""
    keys = [k for k in SERIES if k in df.columns]
    out: dict[str, Any] = {}
    for what in ("ttft", "tpot"):
        table = pd.DataFrame({"series": df.groupby(keys, dropna=False).ngroup(),
                              "clients": pd.to_numeric(df["concurrency"], errors="coerce"),
                              "value": pd.to_numeric(df[f"silicon_{what}_ms"], errors="coerce")})
        table = table[(table["clients"] > 0) & (table["value"] > 0)]
        points = table.groupby(["series", "clients"])["value"].median().reset_index()
        misses: list[float] = []
        for _, series in points.groupby("series"):
            x = np.log(series["clients"].to_numpy(float))
            y = np.log(series["value"].to_numpy(float))
            between = y[:-2] + (y[2:] - y[:-2]) * (x[1:-1] - x[:-2]) / (x[2:] - x[:-2])
            misses.extend(100 * np.abs(np.exp(y[1:-1] - between) - 1))
        out[f"{what}_smooth_mdape_pct"] = round(float(np.median(misses)), 1) if misses else None
        out["smooth_rows"] = len(misses)
    return out


FLOOR_GROUPS = ("backend", "model", "gpu", "band")
# a series as one engine version ran it
VERSION_SERIES = SERIES + ("backend_version",)


def _centred_mdape(ratio: pd.Series, by: list) -> float | None:
    """The median absolute % error left once each group's ratios are divided by its median."""
    if not len(ratio):
        return None
    centred = ratio / ratio.groupby(by, dropna=False).transform("median")
    return round(float(100 * (centred - 1).abs().median()), 1)


def group_floor(compared: pd.DataFrame) -> dict:
    """How far constants fitted per group could go: each row's predicted/measured ratio over its
    group's median ratio (backend, model, GPU, concurrency band), the median absolute % error of
    that. A fit giving every group the one factor that centres it would reach this and no
    further; what is left lies inside the groups (layouts, lengths, engine versions). The same
    per deployment series (one layout, lengths and engine version at all its concurrencies):
    what a model right about every deployment's level would still miss, in how each one's
    figures move with the number of clients."""
    series = [compared[k] for k in VERSION_SERIES if k in compared.columns]
    out: dict[str, Any] = {}
    for what in ("ttft", "tpot"):
        ratio = compared[f"{what}_ratio"]
        out[f"{what}_group_floor_pct"] = _centred_mdape(ratio, [compared[k] for k in FLOOR_GROUPS])
        out[f"{what}_deployment_floor_pct"] = _centred_mdape(ratio, series)
    return out


# what `cases` adds to a file's columns that a report may also be grouped by
DERIVED_GROUPS = ("engine", "concurrency")


def check_groups(columns, by: Sequence[str]) -> None:
    """`by` names columns a report can be grouped by (a file's own, `GROUPS`, `DERIVED_GROUPS`),
    or one InputError names the first that is not one."""
    known = dict.fromkeys((*GROUPS, *DERIVED_GROUPS, *columns))
    for column in by:
        if column not in known:
            raise InputError(f"--by: no column {column!r}; known: {', '.join(known)}")


def summarise(df: pd.DataFrame, by: Sequence[str] = ()) -> dict:
    """The report: overall and per group figures on the rows compared (`GROUPS`, then any other
    column of `df` named in `by`: a file's own dimensions, such as its engine versions), the
    skipped rows by reason, the noise floor of repeated measurements, the scatter of each
    deployment's measurements across concurrencies, and how far constants per group could go."""
    check_groups(df.columns, by)
    compared = df[df["skipped"] == ""]
    skipped = df[df["skipped"] != ""]
    reasons = skipped["skipped"].str.replace(r"\s+\(.*", "", regex=True)
    summary: dict[str, Any] = {
        "rows": int(len(df)),
        "rows_compared": int(len(compared)),
        "rows_skipped": {str(k): int(v) for k, v in reasons.value_counts().items()},
        **{k: v for k, v in _figures(compared).items() if k != "rows"},
        "noise_floor": {**noise_floor(df), **smoothness_floor(df)},
        "group_floor": group_floor(compared),
        "groups": {g: {str(k): _figures(part) for k, part in compared.groupby(g, dropna=False)}
                   for g in dict.fromkeys((*GROUPS, *by))},
    }
    return summary


def format_report(summary: dict) -> str:
    lines = [f"{summary['rows_compared']} of {summary['rows']} rows compared: mean TTFT median |error| "
             f"{summary['ttft_mdape_pct']}% (predicted/measured {summary['ttft_median_ratio']}), mean "
             f"TPOT {summary['tpot_mdape_pct']}% ({summary['tpot_median_ratio']})"]
    noise = summary["noise_floor"]
    if noise.get("repeated_rows"):
        lines.append(f"noise floor, {noise['repeated_rows']} distinct measurements of repeated "
                     "deployments: TTFT "
                     f"{noise['ttft_repeat_mdape_pct']}%, TPOT {noise['tpot_repeat_mdape_pct']}% from "
                     "their deployment's median")
    if noise.get("smooth_rows"):
        lines.append(f"scatter across concurrencies, {noise['smooth_rows']} inner concurrencies of "
                     "deployments measured at 3+: the log-log line through their neighbours "
                     f"misses TTFT by {noise['ttft_smooth_mdape_pct']}%, TPOT by "
                     f"{noise['tpot_smooth_mdape_pct']}% (median)")
    floor = summary["group_floor"]
    if floor["ttft_group_floor_pct"] is not None:
        lines.append("each group (backend, model, GPU, band) centred on its median ratio, as one "
                     f"fitted factor a group would: TTFT {floor['ttft_group_floor_pct']}%, TPOT "
                     f"{floor['tpot_group_floor_pct']}% left")
        lines.append("each deployment (layout, lengths, engine version; all its concurrencies) "
                     f"centred likewise: TTFT {floor['ttft_deployment_floor_pct']}%, TPOT "
                     f"{floor['tpot_deployment_floor_pct']}% left")
    for reason, count in summary["rows_skipped"].items():
        lines.append(f"  skipped {count}: {reason}")
    for group, parts in summary["groups"].items():
        lines.append(f"by {group}:")
        for key, f in parts.items():
            lines.append(f"  {key:<22} {f['rows']:>5} rows  TTFT {f['ttft_mdape_pct']:>6.1f}% "
                         f"({f['ttft_median_ratio']:.2f})  TPOT {f['tpot_mdape_pct']:>6.1f}% "
                         f"({f['tpot_median_ratio']:.2f})")
    return "\n".join(lines)


SLACK_POINTS = 2.0      # a pinned median error may rise this much before the check fails


def pinned_figures(summary: dict) -> dict:
    """What a pin file keeps of a report: rows compared, and the median errors overall and of
    every model and backend with at least 20 rows."""
    keep = {"rows_compared": summary["rows_compared"],
            "ttft_mdape_pct": summary["ttft_mdape_pct"], "tpot_mdape_pct": summary["tpot_mdape_pct"]}
    for group in ("model", "backend"):
        for key, f in summary["groups"][group].items():
            if f["rows"] >= 20:
                keep[f"{group}:{key}"] = {"ttft_mdape_pct": f["ttft_mdape_pct"],
                                          "tpot_mdape_pct": f["tpot_mdape_pct"]}
    return keep


def check_pins(summary: dict, pins: dict) -> list[str]:
    """What moved past its pin: a median error more than SLACK_POINTS above the pinned one, fewer
    rows compared, a pinned group gone."""
    now = pinned_figures(summary)
    moved = []
    if now["rows_compared"] < pins["rows_compared"]:
        moved.append(f"rows_compared {now['rows_compared']} < pinned {pins['rows_compared']}")
    for key, pinned in pins.items():
        if key == "rows_compared":
            continue
        figures = now if key in ("ttft_mdape_pct", "tpot_mdape_pct") else now.get(key)
        if figures is None:
            moved.append(f"{key}: no longer has 20 rows compared")
            continue
        for metric in (("ttft_mdape_pct", "tpot_mdape_pct") if isinstance(pinned, dict) else (key,)):
            was = pinned[metric] if isinstance(pinned, dict) else pinned
            value = figures[metric] if isinstance(pinned, dict) else figures[key]
            if value > was + SLACK_POINTS:
                moved.append(f"{key} {metric} {value}% > pinned {was}% + {SLACK_POINTS:g}")
    return moved


def engine_overrides(settings: Sequence[str]) -> dict:
    """`FIELD=VALUE` what-if settings of the engine's constants (its batching defaults
    included), checked as a config's `perf` and `batching` fields."""
    from pddsim.config import Batching, Perf, parse_override
    from pddsim.schema import validated
    overrides = dict(parse_override(s) for s in settings)
    validated(Perf, {k: v for k, v in overrides.items() if k not in ENGINE_BATCHING}, "--set")
    validated(Batching, {k: v for k, v in overrides.items() if k in ENGINE_BATCHING}, "--set")
    return overrides
