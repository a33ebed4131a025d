"""Planner speed: one plan of the paper's same-DC scenario over 8 x 8 = 64 prefill / decode splits,
run with 1 and 2 local worker processes and on a local Ray instance with 2 CPUs.

Prints the points simulated out of the space, each backend's wall time, the speed-up of 2 workers
over 1 (target: >= 1.7 on 2 cores) and Ray's overhead per point against 2 local workers, as a share
of a point's run time there (target: < 5%). Every backend must give the same plan; the script checks it.
A shared machine's speed drifts by tens of percent within minutes, more than the differences
measured here, so the backends run in ROUNDS rounds (default 2), each in the reverse order of the
one before, and the figures compare each backend's best round; every round is printed too.
A reduced workload, replayed open loop, keeps it to minutes:
`python benchmarks/bench_plan.py [HORIZON_S [ROUNDS]]` (default 60 s of session starts).
"""
from __future__ import annotations

import sys
import time

from pddsim.config import bundled
from pddsim.experiments.backends import Processes, Ray
from pddsim.experiments.plan import plan

VARY = ["clusters.a.instances.0.count=1..8", "clusters.a.instances.1.count=1..8"]
BACKENDS = {"1 process": lambda: Processes(1), "2 processes": lambda: Processes(2),
            "Ray, 2 CPUs": lambda: Ray(jobs=2)}


def main() -> int:
    horizon_s = float(sys.argv[1]) if len(sys.argv) > 1 else 60
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    config = bundled("paper/same_dc_pd.yaml")
    # open loop: a reduced closed-loop workload never loads the larger splits up to their capacity
    overrides = [f"workload.horizon_s={horizon_s}", "workload.replay=open"]
    walls: dict[str, list[float]] = {label: [] for label in BACKENDS}
    plans = []
    for r in range(rounds):
        for label in (list(BACKENDS) if r % 2 == 0 else list(BACKENDS)[::-1]):
            with BACKENDS[label]() as backend:
                t0 = time.perf_counter()
                plans.append(plan(config, VARY, overrides, seed=0, backend=backend).to_json())
                walls[label].append(time.perf_counter() - t0)
    first = plans[0]
    same = all(p == first for p in plans)
    print(f"points simulated   {first['simulated']} of {first['space']} "
          f"(seed 0, {horizon_s:g} s of session starts)")
    for label, times in walls.items():
        print(f"{label:<18} {min(times):7.1f} s  (rounds: {', '.join(f'{t:.1f}' for t in times)})")
    t1, t2, tr = (min(walls[label]) for label in BACKENDS)
    print(f"speed-up, 2 vs 1   {t1 / t2:.2f}x (target >= 1.7x)")
    # on the same 2 CPUs, what Ray adds per point over local processes, as a share of the time
    # a point takes there (starting Ray is not counted: a cluster is started once)
    n = first["simulated"]
    print(f"Ray overhead       {(tr - t2) / n:+.3f} s per point, {(tr - t2) / t2:+.1%} "
          f"of a point's {t2 / n:.2f} s on 2 workers (target < 5%)")
    print(f"same plan on every backend and round: {'yes' if same else 'NO'}")
    print(f"best split: {first['best']['values'] if first['best'] else None}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
