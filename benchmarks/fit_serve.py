"""Fit a serving engine's constants (pddsim/data/engines.yaml: vllm, sglang, trtllm) to measured
serving benchmarks of that engine: `python benchmarks/fit_serve.py --against FILE.csv --engine vllm`.

How: the file's rows of the engine's backend that the catalogs can represent, each deployment once
(repeated measurements of one deployment are noise: their median stands for them), at most
`--rows` of them drawn evenly over models (seeded). The loss of a row is |log(predicted/measured)|
of mean TTFT plus `--tpot-weight` times that of mean TPOT, each capped at `--cap` (a ratio: 1.5
counts a row at most as far as a 1.5x miss) so that rows the model cannot represent do not steer
the rest (a low cap makes the loss count the rows within it, as the median errors the fit is
judged by do); the objective is the mean over models of their
rows' mean loss, so every model counts alike. Coordinate descent from the engine's current
profile: each continuous constant in turn is moved by a factor for as long as that lowers the
objective (a line search each way, within physical bounds), each policy set to each of its
choices; the factor is halved after a pass that moves nothing. The fitted profile is printed as
YAML; `pddsim bench serve` then reports its errors on every row.

`--objective median` fits to the figures the report is judged by instead (`median_objective`):
every row of the engine that its current profile represents, no sampling and no merging, each
distinct deployment replayed once (`cases`); the median errors over all rows and per model, each
over its target.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pddsim import catalog  # noqa: E402
from pddsim.experiments.backends import Processes  # noqa: E402
from pddsim.experiments.serve_bench import DEPLOYMENT, cases, profile, read_rows  # noqa: E402

# constant: (low, high) for continuous ones, a tuple of choices for the others
SPACE = {
    "linear_bf16": (0.2, 0.95), "linear_fp8": (0.2, 0.95), "linear_fp4": (0.1, 0.95),
    "attn_prefill": (0.1, 0.9), "attn_decode": (0.05, 0.9), "memory": (0.4, 0.95),
    "grouped_gemm": (0.1, 1.0), "expert_tokens_half": (0.0, 1024.0),
    "expert_memory": (0.3, 1.0), "moe_layer_us": (0.0, 200.0),
    "overhead_ms": (0.0, 30.0), "seq_us": (0.0, 300.0), "allreduce_base_us": (0.0, 60.0),
    "allreduce_step_us": (0.0, 10.0), "alltoall_us": (0.0, 300.0), "alltoall_step_us": (0.0, 50.0),
    "stream_us": (0.0, 200.0),
    "frontend_ms": (0.0, 300.0), "frontend_serial_ms": (0.0, 50.0),
    "frontend_jitter_ms": (0.0, 200.0), "activation_gb": (0.0, 40.0),
    "memory_utilization": (0.6, 0.97),
    "reserve_share": (0.0, 1.0), "eager_moe_layer_us": (0.0, 10000.0), "eager_expert_us": (0.0, 100.0),
    "host_layer_us": (0.0, 3000.0),
    "token_budget": (1024, 2048, 4096, 8192, 16384, 32768, 65536),
    "overlap": (False, True), "scheduler": ("mixed", "prefill_first"),
    "admission": ("optimistic", "reserve"), "chunk_packing": ("packed", "whole"),
    "memory_rule": ("total", "free"), "graph_max_batch": (0, 64, 128, 256, 512, 1024),
}


def deployments(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per deployment and engine profile it is replayed under, its measurements the
    median of its repeats."""
    df = rows.copy()
    df["concurrency"] = df["silicon_data_source"].str.extract(r"silicon_concurrency=(\d+)")[0]
    df["profile"] = [profile(row) for row in df.to_dict("records")]
    keys = [k for k in DEPLOYMENT if k in df.columns] + ["profile"]
    for what in ("silicon_ttft_ms", "silicon_tpot_ms"):
        df[what] = pd.to_numeric(df[what], errors="coerce")
        df[what] = df.groupby([df[k].astype(str) for k in keys])[what].transform("median")
    return df.drop_duplicates(subset=keys).drop(columns=["concurrency", "profile"])


def objective(table: pd.DataFrame, tpot_weight: float, cap: float) -> tuple[float, int]:
    done = table[table["skipped"] == ""]
    if done.empty:
        return float("inf"), 0
    cap = math.log(cap)
    loss = (np.minimum(np.log(done["ttft_ratio"]).abs(), cap)
            + tpot_weight * np.minimum(np.log(done["tpot_ratio"]).abs(), cap))
    missing = len(table) - len(done)            # a row the profile makes unrepresentable
    per_model = loss.groupby(done["model"]).mean()
    return float(per_model.mean()) + missing * 2 * cap / len(table), len(done)


def median_objective(table: pd.DataFrame) -> float:
    """The figures the report is judged by, against their targets: the median absolute % error
    of mean TTFT over 20% plus that of mean TPOT over 10%, over all rows (each counted as the
    file has it) plus the mean of the same over the models with at least 20 rows, so that no
    model is given up for the rest; a row the profile makes unrepresentable counts as missed by
    100%."""
    done = table["skipped"] == ""
    err = pd.DataFrame({"model": table["model"],
                        "ttft": table["ttft_abs_err_pct"].where(done, 100.0) / 20,
                        "tpot": table["tpot_abs_err_pct"].where(done, 100.0) / 10})
    per_model = err.groupby("model").filter(lambda g: len(g) >= 20).groupby("model")
    medians = per_model[["ttft", "tpot"]].median().sum(axis=1)
    return float(err["ttft"].median() + err["tpot"].median() + medians.mean())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True)
    ap.add_argument("--engine", required=True, choices=("vllm", "sglang", "trtllm"))
    ap.add_argument("--rows", type=int, default=240, help="deployments fitted on at most")
    ap.add_argument("--max-concurrency", type=int, default=2048)
    ap.add_argument("--tpot-weight", type=float, default=1.5)
    ap.add_argument("--cap", type=float, default=4.0, help="largest predicted/measured ratio a "
                    "row's loss counts (each way)")
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--only", nargs="*", help="fit only these constants")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--objective", choices=("loss", "median"), default="loss",
                    help="loss: the capped log loss over sampled deployments (above); median: "
                    "median_objective over every row of the engine the profile can represent")
    args = ap.parse_args()

    rows = read_rows(Path(args.against))
    rows = rows[rows["backend"] == args.engine]
    if args.objective == "loss":
        rows = deployments(rows)
        conc = rows["silicon_data_source"].str.extract(r"silicon_concurrency=(\d+)")[0].astype(float)
        rows = rows[conc <= args.max_concurrency]
        rng = np.random.default_rng(args.seed)
        per_model = max(1, args.rows // max(rows["model_path"].nunique(), 1))
        picked = [g.iloc[rng.permutation(len(g))[:per_model]] for _, g in rows.groupby("model_path")]
        rows = pd.concat(picked).sort_values("line")
    print(f"{args.engine}: {len(rows)} rows", file=sys.stderr)

    base = catalog.engine(args.engine)
    current = {k: getattr(base, k) for k in SPACE}
    names = args.only or list(SPACE)

    def changes(values: dict) -> dict:
        """What a trial changes of the engine's profile: each row is replayed under its own
        profile (`serve_bench.profile`), and one named for a version keeps what it sets otherwise."""
        return {k: v for k, v in values.items() if v != getattr(base, k)}

    with Processes(args.jobs) as backend:
        if args.objective == "median":       # the rows the starting profile represents
            start = cases(rows, backend, None, {}, rounds=args.rounds)
            rows = rows[(start["skipped"] == "").to_numpy()]
            print(f"  {len(rows)} of them represented", file=sys.stderr)

        def score(values: dict) -> float:
            table = cases(rows, backend, None, changes(values), rounds=args.rounds)
            if args.objective == "median":
                return median_objective(table)
            return objective(table, args.tpot_weight, args.cap)[0]
        t0 = time.perf_counter()
        best = score(current)
        print(f"start {best:.4f} ({time.perf_counter() - t0:.0f} s an evaluation)", file=sys.stderr)
        step = 1.5
        for _ in range(args.passes):
            moved = False
            for name in names:
                space = SPACE[name]
                continuous = len(space) == 2 and isinstance(space[0], float)
                if not continuous:                     # a choice: try each
                    for t in [c for c in space if c != current[name]]:
                        s = score({**current, name: t})
                        if s < best - 1e-4:
                            best, current[name], moved = s, t, True
                            print(f"  {name} = {t}  -> {best:.4f}  [{time.perf_counter() - t0:.0f} s]",
                                  file=sys.stderr)
                    continue
                lo, hi = space
                for factor in (step, 1 / step):        # a line search each way
                    while True:
                        value = current[name]
                        t = lo + (hi - lo) * 0.05 if value == 0 else min(hi, max(lo, value * factor))
                        t = round(t, 4)
                        if t == value:
                            break
                        s = score({**current, name: t})
                        if s >= best - 1e-4:
                            break
                        best, current[name], moved = s, t, True
                        print(f"  {name} = {t}  -> {best:.4f}  [{time.perf_counter() - t0:.0f} s]",
                              file=sys.stderr)
            if not moved:
                step = 1 + (step - 1) / 2
                if step < 1.05:
                    break
    print(f"# {args.engine}: objective {best:.4f} on {len(rows)} rows")
    print(f"{args.engine}:")
    for k, v in current.items():
        print(f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
