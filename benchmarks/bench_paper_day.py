"""A day of the paper PDD scenario (configs/paper/pdd.yaml): its closed-loop agent sessions started
at the paper's session rate for HOURS hours, then simulated; the whole run, workload generation
included, against 1M bare SimPy timeouts timed in the same process (target for 24 h: ratio <= 15).
`python benchmarks/bench_paper_day.py [HOURS]` (default 1; 24 is the full day, ~17k sessions).
"""
from __future__ import annotations

import sys
import time

from bench_event_loop import bare_timeouts

from pddsim.config import bundled, load_config
from pddsim.sim import load_workload, simulate


def main() -> int:
    hours = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    cfg = load_config(bundled("paper/pdd.yaml"), values={"workload.horizon_s": hours * 3600})
    rate = cfg.workload.session_rate_rps
    t0 = time.perf_counter()
    workload = load_workload(cfg)
    t1 = time.perf_counter()
    result = simulate(cfg, workload)
    t2 = time.perf_counter()
    bare_s = bare_timeouts()
    s = result.summary
    print(f"sessions            {workload.sessions} ({hours:g} h at {rate:g}/s)")
    print(f"requests            {s['requests_completed']} of {s['requests_total']} completed")
    print(f"workload generation {t1 - t0:.2f} s")
    per_request = (t2 - t1) / max(len(workload.requests), 1)
    print(f"simulate            {t2 - t1:.2f} s  ({per_request * 1e6:.0f} us/request)")
    print(f"1M bare timeouts    {bare_s:.3f} s")
    print(f"ratio  {(t2 - t0) / bare_s:.2f}  (target for 24 h <= 15)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
