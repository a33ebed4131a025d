"""Fleet size: same-DC PD (Llama-3.1-70B, 8 x H100 instances, half prefill, half decode) at 4, 64
and 1,024 instances with the load per instance fixed: Poisson arrivals at RATE_PER_INSTANCE
requests per second per instance, conversation-like lengths (1,000 tokens in, 250 out, lognormal),
at least 10,000 requests and PER_INSTANCE per instance. Prints the cost per request at each size
and its ratio to the 4-instance one (target at 1,024: <= 1.5), and `ratio` = the whole benchmark's
wall time over 1M bare SimPy timeouts. `python benchmarks/bench_fleet.py [PER_INSTANCE]`
(default 20, 20,480 requests at 1,024 instances).
"""
from __future__ import annotations

import sys
import time

from bench_event_loop import CONFIG, bare_timeouts

from pddsim.config import from_dict
from pddsim.sim import load_workload, simulate

SIZES = (4, 64, 1024)
RATE_PER_INSTANCE = 1.25


def fleet(instances: int, requests: int) -> dict:
    """The event-loop benchmark's deployment at `instances` instances, the load per instance fixed."""
    cluster = CONFIG["clusters"]["a"]
    return {**CONFIG, "name": f"fleet_{instances}",
            "clusters": {"a": {**cluster, "instances": [
                {**i, "count": instances // 2} for i in cluster["instances"]]}},
            "workload": {"synthetic": {"kind": "poisson", "knobs": {
                "n_requests": requests, "rate_rps": RATE_PER_INSTANCE * instances,
                "input_mean": 1000, "output_mean": 250, "input_sigma": 0.8, "output_sigma": 0.8}}}}


def main() -> int:
    per_instance = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    total, per_request = 0.0, {}
    for n in SIZES:
        cfg = from_dict(fleet(n, max(10_000, per_instance * n)), "benchmark")
        workload = load_workload(cfg)
        t0 = time.perf_counter()
        result = simulate(cfg, workload)
        wall = time.perf_counter() - t0
        total += wall
        done = result.summary["requests_completed"]
        per_request[n] = wall / max(done, 1)
        print(f"{n:>5} instances   {done:>7} requests  {wall:7.2f} s  "
              f"{per_request[n] * 1e6:7.0f} us/request  x{per_request[n] / per_request[SIZES[0]]:.2f}")
    bare_s = bare_timeouts()
    print(f"1M bare timeouts    {bare_s:.3f} s")
    print(f"cost at {SIZES[-1]} / at {SIZES[0]}  {per_request[SIZES[-1]] / per_request[SIZES[0]]:.2f}"
          f"  (target <= 1.5)")
    print(f"ratio  {total / bare_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
