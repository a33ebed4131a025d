"""Behaviour-neutral refactors: run every bundled config (`configs/*.yaml`, `configs/faults/*.yaml`,
`configs/paper/*.yaml`) and keep each run's tables (requests, time series, instances, sessions) and
summary and link totals, or compare a new run with kept ones and say, per config, which tables differ
(`DataFrame.equals`) and which summary figures moved.

    python benchmarks/snapshot_results.py save DIR [--sessions N]
    python benchmarks/snapshot_results.py compare DIR [--sessions N]

Every config runs whole (about a minute in all); `--sessions N` keeps the paper configs' synthetic
agent workloads to N sessions for a quicker look.
Exits 1 when any table or figure differs.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from pddsim.config import load_config
from pddsim.sim import load_workload, simulate

ROOT = Path(__file__).resolve().parents[1]
GLOBS = ("configs/*.yaml", "configs/faults/*.yaml", "configs/paper/*.yaml")
VOLATILE = {"wall_s"}   # the run's own wall time: never the same twice


def configs() -> list[Path]:
    return [p for g in GLOBS for p in sorted(ROOT.glob(g))]


def run(path: Path, sessions: int | None):
    overrides = []
    if sessions is not None and "paper" in path.parts:
        overrides.append(f"workload.synthetic.knobs.sessions={sessions}")
    cfg = load_config(path, overrides)
    return simulate(cfg, load_workload(cfg))


TABLES = ("requests", "timeseries", "instances", "sessions")


def key(path: Path) -> str:
    return str(path.relative_to(ROOT)).replace("/", "__").removesuffix(".yaml")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("save", "compare"))
    ap.add_argument("dir", type=Path)
    ap.add_argument("--sessions", type=int, default=None)
    args = ap.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    differ = 0
    for path in configs():
        res = run(path, args.sessions)
        name = key(path)
        summary = {k: v for k, v in res.summary.items() if k not in VOLATILE}
        figures = {"summary": summary, "links": res.links}
        if args.mode == "save":
            for table in TABLES:
                getattr(res, table).to_pickle(args.dir / f"{name}.{table}.pkl")
            (args.dir / f"{name}.json").write_text(json.dumps(figures, indent=1, default=str))
            print(f"{name}: {len(res.requests)} requests kept")
            continue
        unequal = [t for t in TABLES
                   if not getattr(res, t).equals(pd.read_pickle(args.dir / f"{name}.{t}.pkl"))]
        was = json.loads((args.dir / f"{name}.json").read_text())
        now = json.loads(json.dumps(figures, default=str))
        moved = sorted(f"{part}.{k}" for part in now for k in set(was[part]) | set(now[part])
                       if json.dumps(was[part].get(k)) != json.dumps(now[part].get(k)))   # NaN == NaN
        differ += bool(unequal or moved)
        print(f"{name}: tables that differ: {unequal or 'none'}; figures moved: {moved or 'none'}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
