"""The Claude-Code sessions of ../shared/traces/kv_cache_tester (100K+-token contexts, 64-token
blocks) replayed closed loop through the paper PDD deployment (configs/paper/pdd.yaml): trace
loading and the simulation timed apart, the cost per request printed, and `ratio` = load +
simulate over 1M bare SimPy timeouts timed in the same process (target for all 49,334 requests:
<= 40). `python benchmarks/bench_agent_trace.py [LIMIT]` (default 5,000 requests; 0 = all).
Skips when ../shared is absent.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from bench_event_loop import bare_timeouts

from pddsim.config import bundled, load_config
from pddsim.sim import load_workload, simulate

TRACE = Path(__file__).resolve().parents[2] / "shared/traces/kv_cache_tester"


def main() -> int:
    if not TRACE.exists():
        print(f"skipped: {TRACE} is absent")
        return 0
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    workload_cfg = {"trace": str(TRACE), "replay": "closed", "limit": limit or None}
    cfg = load_config(bundled("paper/pdd.yaml"), values={"workload": workload_cfg})
    t0 = time.perf_counter()
    workload = load_workload(cfg)
    t1 = time.perf_counter()
    result = simulate(cfg, workload)
    t2 = time.perf_counter()
    bare_s = bare_timeouts()
    s, n = result.summary, max(len(workload.requests), 1)
    print(f"requests            {s['requests_completed']} of {s['requests_total']} completed "
          f"({workload.sessions} sessions)")
    print(f"load trace          {t1 - t0:.2f} s  ({(t1 - t0) / n * 1e6:.0f} us/request)")
    print(f"simulate            {t2 - t1:.2f} s  ({(t2 - t1) / n * 1e6:.0f} us/request)")
    print(f"1M bare timeouts    {bare_s:.3f} s")
    print(f"ratio  {(t2 - t0) / bare_s:.2f}  (target for all 49,334 requests <= 40)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
