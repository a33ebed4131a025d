"""The capacity search of the paper scenarios (configs/paper/), with and without early stop, and
started from a neighbour's capacity load (the deployment with one more prefill instance, as a plan
starts its points): the runs and CPU seconds each saves (process time: a shared machine's load does
not move it), and that all find the same capacity; the early-stopped search also against 1M bare
SimPy timeouts timed in the same process (target for the full scenario: ratio <= 60).
`python benchmarks/bench_capacity.py [HORIZON_S]` (default 900 s of session starts, 4 turns a
session, so each run still reaches its plateau; 0 = the configs' own workload).
"""
from __future__ import annotations

import sys
import time

from bench_event_loop import bare_timeouts

from pddsim.config import bundled, load_config
from pddsim.experiments.capacity import find_capacity
from pddsim.sim import load_workload


def main() -> int:
    horizon_s = float(sys.argv[1]) if len(sys.argv) > 1 else 900
    values = {"workload.horizon_s": horizon_s, "workload.synthetic.knobs.turns_mean": 4} \
        if horizon_s else {}
    bare_s = bare_timeouts()
    same = True
    for name in ("same_dc_pd", "pdd"):
        cfg = load_config(bundled(f"paper/{name}.yaml"), values=values)
        workload = load_workload(cfg)
        searches = {}
        for early in (True, False):
            t0 = time.process_time()
            cap = find_capacity(cfg, workload, early_stop=early)
            searches[early] = (cap, time.process_time() - t0)
        (stop, stop_s), (full, full_s) = searches[True], searches[False]
        same &= (stop.capacity_rps, stop.load) == (full.capacity_rps, full.load)
        found = (f"{stop.capacity_rps:.3f} req/s [{stop.interval[0]:.3f}, {stop.interval[1]:.3f}]"
                 if stop.found and stop.interval else stop.status)
        print(f"{cfg.name}: capacity {found} at {stop.knob}={stop.load:.4g}")
        print(f"  early stop     {stop.runs} runs ({stop.stopped_early} stopped early), "
              f"{stop_s:.1f} CPU s")
        print(f"  run to the end {full.runs} runs, {full_s:.1f} CPU s: saves {full_s - stop_s:.1f} s "
              f"({1 - stop_s / full_s:.0%}); "
              f"same capacity: {(stop.capacity_rps, stop.load) == (full.capacity_rps, full.load)}")
        prefill = cfg.clusters["a"].instances[0].count
        neighbour = load_config(bundled(f"paper/{name}.yaml"), values={
            **values, "clusters.a.instances.0.count": prefill + 1})
        start = find_capacity(neighbour, load_workload(neighbour)).load
        t0 = time.process_time()
        near = find_capacity(cfg, workload, start=start)
        near_s = time.process_time() - t0
        agree = (near.capacity_rps, near.load) == (stop.capacity_rps, stop.load)
        same &= agree or not stop.found         # a search that found none stops where it began
        print(f"  from the neighbour's capacity load ({prefill + 1} prefill: {start:.4g}) "
              f"{near.runs} runs, {near_s:.1f} CPU s: saves {stop_s - near_s:.1f} s "
              f"({1 - near_s / stop_s:.0%}) of the early-stopped search; same capacity: "
              f"{agree if stop.found else 'none found'}")
    print(f"1M bare timeouts    {bare_s:.3f} s")
    print(f"ratio  {stop.wall_s / bare_s:.2f}  (the PDD search with early stop, wall; target for "
          "the full scenario <= 60)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
