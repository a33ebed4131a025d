"""Memory and cost per request at scale: 1,000,000 synthetic Poisson requests through same-DC PD
(Llama-3.1-70B, 4 prefill + 4 decode instances of 8 x H100), workload generation included.
Finished requests keep only their record (a row of compact columns), so the peak resident set
stays bounded. Prints the peak RSS (target <= 1 GB) and `ratio` = the whole run over 1M bare
SimPy timeouts timed in the same process (target <= 40).
`python benchmarks/bench_million.py [REQUESTS]` (default 1,000,000).
"""
from __future__ import annotations

import resource
import sys
import time

from bench_event_loop import bare_timeouts

from pddsim.config import from_dict
from pddsim.sim import load_workload, simulate

N = 1_000_000


def config(n: int) -> dict:
    return {
        "name": "million_same_dc_pd",
        "model": "llama-3.1-70b",
        "clusters": {"a": {"gpu": "h100-sxm", "rdma": {"bandwidth_gbps": 400, "rtt_ms": 0.02},
                           "instances": [{"role": "prefill", "count": 4, "tp": 8},
                                         {"role": "decode", "count": 4, "tp": 8}]}},
        "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
        "workload": {"synthetic": {"kind": "poisson", "knobs": {
            "n_requests": n, "rate_rps": 40.0, "input_mean": 1000, "output_mean": 150,
            "shared_prefix_tokens": 512}}},
    }


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else N
    cfg = from_dict(config(n), "benchmark")
    t0 = time.perf_counter()
    workload = load_workload(cfg)
    t1 = time.perf_counter()
    result = simulate(cfg, workload)
    t2 = time.perf_counter()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    bare_s = bare_timeouts()
    s = result.summary
    print(f"requests         {s['requests_completed']} of {s['requests_total']} completed")
    print(f"generate         {t1 - t0:.1f} s")
    print(f"simulate         {t2 - t1:.1f} s  ({(t2 - t1) / n * 1e6:.0f} us per request)")
    print(f"peak RSS         {peak_mb:.0f} MB  (target <= 1024 MB)")
    print(f"1M bare timeouts {bare_s:.3f} s")
    print(f"ratio  {(t2 - t0) / bare_s:.2f}  (target for 1M requests <= 40)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
