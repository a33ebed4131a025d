"""Memory: replay 1,000,000 synthetic requests and print the peak resident set size.

Finished requests keep only their record (a row of compact columns), so the peak stays far below
the 2 GB target. Same-DC PD, Llama-3.1-70B, 4 prefill + 4 decode instances of 8 x H100.
"""
from __future__ import annotations

import resource
import sys
import time

from pddsim.config import from_dict
from pddsim.sim import simulate
from pddsim.workload.synthetic import poisson_workload

N = 1_000_000
CONFIG = {
    "name": "million_same_dc_pd",
    "model": "llama-3.1-70b",
    "clusters": {"a": {"gpu": "h100-sxm", "rdma": {"bandwidth_gbps": 400, "rtt_ms": 0.02},
                       "instances": [{"role": "prefill", "count": 4, "tp": 8},
                                     {"role": "decode", "count": 4, "tp": 8}]}},
    "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
    "workload": {"synthetic": {"kind": "poisson"}},
}


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else N
    cfg = from_dict(CONFIG, "benchmark")
    t0 = time.perf_counter()
    workload = poisson_workload(n, 40.0, 1000, 150, shared_prefix_tokens=512, seed=0)
    t1 = time.perf_counter()
    result = simulate(cfg, workload)
    t2 = time.perf_counter()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    s = result.summary
    print(f"requests         {s['requests_completed']} of {s['requests_total']} completed")
    print(f"generate         {t1 - t0:.1f} s")
    print(f"simulate         {t2 - t1:.1f} s  ({(t2 - t1) / n * 1e6:.0f} us per request)")
    print(f"peak RSS         {peak_mb:.0f} MB  (target <= 2048 MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
