"""The capacity search of the paper PDD scenario (configs/paper/pdd.yaml), whole: every run of
`find_capacity` from the configured load, against 1M bare SimPy timeouts timed in the same process
(target for the full scenario: ratio <= 60). `python benchmarks/bench_capacity.py [SESSIONS]`
(default 60 sessions; 0 = the config's 360).
"""
from __future__ import annotations

import sys
import time

from bench_event_loop import bare_timeouts

from pddsim.config import bundled, load_config
from pddsim.experiments.capacity import find_capacity
from pddsim.sim import load_workload


def main() -> int:
    sessions = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    values = {"workload.synthetic.knobs.sessions": sessions} if sessions else {}
    cfg = load_config(bundled("paper/pdd.yaml"), values=values)
    t0 = time.perf_counter()
    workload = load_workload(cfg)
    cap = find_capacity(cfg, workload)
    wall = time.perf_counter() - t0
    bare_s = bare_timeouts()
    print(f"workload            {len(workload.requests)} requests, "
          f"{cfg.workload.synthetic.knobs.sessions} sessions")
    found = f"{cap.capacity_rps:.3f} req/s" if cap.found else "not bracketed"
    print(f"capacity            {found} at {cap.knob}={cap.load:g}")
    print(f"search wall         {wall:.2f} s")
    print(f"1M bare timeouts    {bare_s:.3f} s")
    print(f"ratio  {wall / bare_s:.2f}  (target for the full scenario <= 60)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
