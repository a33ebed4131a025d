"""Property-based: random small deployments (1-3 instances per role, random GPUs, memory small
enough to force preemption, random WAN, random faults) serving random workloads (random lengths,
prompts sharing prefixes) keep every invariant (`check_invariants=True`), and every request ends
exactly once with all its tokens or a failure reason. Example counts are bounded so the suite
stays fast; examples that once failed are kept below with @example."""
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_network import _run

from pddsim.config import from_dict
from pddsim.sim import simulate
from pddsim.workload.model import TraceRequest, Workload

GPUS = ("h100-sxm", "h200", "a100-80gb", "mi300x")


def scalings(count: int):
    """A scaling policy for a group of `count`: a schedule over a 10 s day or a reactive
    controller polling every 0.5-2 s, up to 2 more instances, starting in 0.5-3 s."""
    startup = st.fixed_dictionaries({"weights_from": st.just("host"), "host_gb_per_s": st.just(1e3),
                                     "init_s": st.sampled_from((0.5, 3.0))})
    most = st.integers(count, count + 2)
    schedule = most.flatmap(lambda m: st.fixed_dictionaries({
        "policy": st.just("schedule"), "max": st.just(m), "day_s": st.just(10.0),
        "startup": startup,
        "schedule": st.dictionaries(st.sampled_from((0, 4, 9, 15, 20)), st.integers(1, m),
                                    min_size=1)}))
    reactive = st.fixed_dictionaries({
        "policy": st.just("reactive"), "max": most, "startup": startup,
        "interval_s": st.sampled_from((0.5, 2.0)), "cooldown_s": st.sampled_from((0.0, 3.0)),
        "drain_poll_s": st.sampled_from((0.1, 1.0)),
        "queue_per_instance": st.sampled_from((None, 0.5)), "kv_occupancy": st.sampled_from((None, 0.3)),
        "ttft_s": st.sampled_from((None, 0.2)), "tpot_s": st.just(0.01)})
    return st.one_of(schedule, reactive)


@st.composite
def deployments(draw, elastic=False):
    system = draw(st.sampled_from(("colocated", "pd", "pdd")))

    def group(role):   # 1-3 instances; 2 x H100 leave ~8.5k tokens of KV: preemption
        g = {"role": role, "count": draw(st.integers(1, 3)), "tp": draw(st.sampled_from((2, 4, 8)))}
        if elastic and draw(st.booleans()):
            g["scaling"] = draw(scalings(g["count"]))
        return g
    rdma = {"bandwidth_gbps": draw(st.sampled_from((100, 400, 3200)))}
    if system == "colocated":
        clusters = {"a": {"gpu": draw(st.sampled_from(GPUS)), "rdma": rdma,
                          "instances": [group("colocated")]}}
    elif system == "pd":
        clusters = {"a": {"gpu": draw(st.sampled_from(GPUS)), "rdma": rdma,
                          "instances": [group("prefill"), group("decode")]}}
    else:
        clusters = {"a": {"gpu": draw(st.sampled_from(GPUS)), "rdma": rdma,
                          "instances": [group("prefill"), group("relay")]},
                    "b": {"gpu": draw(st.sampled_from(GPUS)), "rdma": rdma,
                          "instances": [group("decode")]}}
    raw = {"name": "prop", "model": "llama-3.1-70b", "clusters": clusters,
           "slo": {"ttft_s": 1.0, "tpot_s": 0.05}, "workload": {"trace": "unused.jsonl"},
           "prefix_cache": {"decode_tokens": draw(st.sampled_from((0, 4096, None)))},
           "batching": {"max_batch": draw(st.sampled_from((2, 8, 64)))}}
    if system == "pdd":
        raw["wan"] = {"bandwidth_gbps": draw(st.sampled_from((1, 10, 100))),
                      "rtt_ms": draw(st.sampled_from((0, 20, 60))),
                      "flow_cap_gbps": draw(st.sampled_from((None, 5))),
                      "background": draw(st.sampled_from((None, {"mean": 0.3, "std": 0.2})))}
        raw["pdd"] = {"handoff": draw(st.sampled_from(("one_shot", "catch_up", "adaptive"))),
                      "path_policy": draw(st.sampled_from(("wan_threshold", "always_relay",
                                                           "never_relay", "oracle"))),
                      "catch_up_tokens": draw(st.sampled_from((4, 64))),
                      "relay_above_s": draw(st.sampled_from((0.0, 0.5)))}
    if draw(st.booleans()):     # random failures of one role, maybe a WAN outage, maybe timeouts
        roles = sorted({g["role"] for c in clusters.values() for g in c["instances"]})
        raw["faults"] = {"random": [{"role": draw(st.sampled_from(roles)),
                                     "mtbf_s": draw(st.sampled_from((1.0, 5.0, 20.0))),
                                     "mttr_s": draw(st.sampled_from((0.5, 3.0)))}],
                         "transfer_timeout_s": draw(st.sampled_from((None, 2.0))),
                         "max_retries": draw(st.integers(0, 2)),
                         "degraded": draw(st.sampled_from(("finish_on_relay", "wait")))}
        if system == "pdd" and draw(st.booleans()):
            raw["faults"]["events"] = [{"kind": "link_down", "link": "wan",
                                        "start_s": draw(st.floats(0, 5)),
                                        "duration_s": draw(st.sampled_from((1.0, 10.0, None)))}]
    return from_dict(raw, "prop")


SPREAD_OUT = st.floats(0.0, 2.0)


@st.composite
def workloads(draw, chains=3, blocks=100, requests=10, gaps=SPREAD_OUT, outputs=400):
    """Up to `requests` requests `gaps` apart, prompts of up to `blocks` 64-token blocks along one
    of `chains` hash chains (so they share prefixes), up to `outputs` tokens out."""
    chain_ids = [list(range(c * 1000, c * 1000 + blocks)) for c in range(chains)]
    reqs, t = [], 0.0
    for _ in range(draw(st.integers(1, requests))):
        t += draw(gaps)
        n = draw(st.integers(1, blocks))
        chain = draw(st.sampled_from(chain_ids))[:n]
        reqs.append(TraceRequest(arrival_s=t, input_tokens=64 * n - draw(st.integers(0, 63)),
                                 output_tokens=draw(st.integers(1, outputs)), hash_ids=tuple(chain),
                                 block_tokens=64))
    return Workload(reqs)


# a colocated instance whose HBM cache's block 0 is in a decoder's KV and in a newly admitted
# prompt's reservation: the block takes room once, so the pool is full but not over-committed
SHARED_BLOCK = from_dict({
    "name": "prop", "model": "llama-3.1-70b", "workload": {"trace": "unused.jsonl"},
    "clusters": {"a": {"gpu": "h100-sxm", "rdma": {"bandwidth_gbps": 100},
                       "instances": [{"role": "colocated", "count": 1, "tp": 2}]}},
    "slo": {"ttft_s": 1.0, "tpot_s": 0.05}, "prefix_cache": {"decode_tokens": 0},
    "batching": {"max_batch": 2}}, "prop")
SHARED_BLOCK_WORKLOAD = Workload([
    TraceRequest(arrival_s=0.0, input_tokens=n, output_tokens=out, hash_ids=tuple(range(n // 64)),
                 block_tokens=64)
    for n, out in ((3200, 4), (64, 1), (64, 1), (64, 1), (5376, 1))])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=deployments(), w=workloads(), seed=st.integers(0, 3))
@example(cfg=SHARED_BLOCK, w=SHARED_BLOCK_WORKLOAD, seed=0)
def test_random_deployments_keep_every_invariant(cfg, w, seed):
    df = simulate(cfg, w, seed=seed, check_invariants=True).requests
    assert sorted(df.request) == list(range(len(w)))
    done = df.status == "completed"
    assert (df[done].tokens_out == df[done].output_tokens).all()
    assert (df[~done].failure != "").all()
    if cfg.faults is not None:      # a fault's failures carry its reason; the engine's its own
        reasons = df[~done].failure.str.split(": ").str[-1]
        assert reasons.isin(["instance_failed", "transfer_timeout", "stalled",
                             "context exceeds the instance's KV memory"]).all()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=deployments(elastic=True), w=workloads(), seed=st.integers(0, 3))
def test_random_elastic_deployments_keep_every_invariant(cfg, w, seed):
    """Pools that scale (schedules, reactive controllers) on random deployments, with random
    failures too: every request ends exactly once, memory is never over-committed."""
    test_random_deployments_keep_every_invariant.hypothesis.inner_test(cfg, w, seed)


def _fluid_finish_times(starts, sizes, capacity, cap):
    """Brute force: step from event to event, every flow in flight at min(cap, capacity / n)."""
    t, left, done = 0.0, {}, {}
    pending = sorted(range(len(starts)), key=lambda i: starts[i])
    while pending or left:
        rate = min(cap or float("inf"), capacity / len(left)) if left else 0.0
        next_start = starts[pending[0]] if pending else float("inf")
        next_end = min(left.values()) / rate if left else float("inf")
        dt = min(next_start - t, next_end)
        for i in left:
            left[i] -= rate * dt
        t += dt
        for i in [i for i, b in left.items() if b <= 1e-9 * sizes[i]]:
            done[i] = t
            del left[i]
        while pending and starts[pending[0]] <= t:
            i = pending.pop(0)
            left[i] = sizes[i]
    return [done[i] for i in range(len(starts))]


@settings(max_examples=40, deadline=None)
@given(flows=st.lists(st.tuples(st.floats(0, 10), st.floats(1, 1000)), min_size=1, max_size=12),
       cap=st.sampled_from((None, 20.0, 60.0)))
def test_link_sharing_matches_a_brute_force_fluid_computation(flows, cap):
    _, finished = _run(dict(bandwidth_Bps=100.0, latency_s=0.0, flow_cap_Bps=cap), flows, until=None)
    expected = _fluid_finish_times([f[0] for f in flows], [f[1] for f in flows], 100.0, cap)
    for i, t in enumerate(expected):
        assert abs(finished[i] - t) <= 1e-6 * max(1.0, t), (i, finished[i], t)


@st.composite
def pdd_under_faults(draw):
    """A small PDD deployment relaying every request with catch-up handoffs, and faults aimed at
    its paths: outages of the WAN or the RDMA fabric, any of its instances lost (for a while or
    for good), at random moments of a few seconds in which prompts, copies, deltas and catch-up
    parts are in flight."""
    def group(role):
        return {"role": role, "count": draw(st.integers(1, 2)), "tp": draw(st.sampled_from((2, 8)))}
    raw = {"name": "prop", "model": "llama-3.1-70b", "workload": {"trace": "unused.jsonl"},
           "clusters": {"a": {"gpu": "h100-sxm", "rdma": {"bandwidth_gbps": 400, "rtt_ms": 2},
                              "instances": [group("prefill"), group("relay")]},
                        "b": {"gpu": "h100-sxm", "rdma": {"bandwidth_gbps": 400},
                              "instances": [group("decode")]}},
           "wan": {"bandwidth_gbps": draw(st.sampled_from((10, 100))),
                   "rtt_ms": draw(st.sampled_from((20, 200)))},
           "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
           "prefix_cache": {"decode_tokens": draw(st.sampled_from((0, None)))},
           "pdd": {"handoff": draw(st.sampled_from(("catch_up", "one_shot"))),
                   "path_policy": draw(st.sampled_from(("always_relay", "wan_threshold"))),
                   "catch_up_tokens": 4, "relay_above_s": 0.0}}
    targets = ["wan", "rdma:a", "a/prefill0", "a/relay0", "b/decode0"]
    events = []
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from(targets))
        start, duration = draw(st.floats(0.0, 4.0)), draw(st.sampled_from((0.5, 3.0, None)))
        if "/" in target:
            events.append({"kind": "instance_down", "instance": target, "start_s": start,
                           "duration_s": duration})
        else:
            events.append({"kind": "link_down", "link": target, "start_s": start, "duration_s": duration})
    raw["faults"] = {"events": events, "transfer_timeout_s": draw(st.sampled_from((None, 1.0))),
                     "max_retries": draw(st.integers(0, 2)),
                     "degraded": draw(st.sampled_from(("finish_on_relay", "wait")))}
    return from_dict(raw, "prop")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=pdd_under_faults(), w=workloads(requests=6, gaps=st.floats(0.0, 0.5), outputs=400),
       seed=st.integers(0, 3))
def test_pdd_under_faults_keeps_every_invariant(cfg, w, seed):
    """PDD's relay, takeover, catch-up and leftover paths under faults: every request ends once,
    every instance and link ends idle with its KV given back (`--check-invariants`)."""
    df = simulate(cfg, w, seed=seed, check_invariants=True).requests
    assert sorted(df.request) == list(range(len(w)))
    done = df.status == "completed"
    assert (df[done].tokens_out == df[done].output_tokens).all()
    reasons = df[~done].failure.str.split(": ").str[-1]
    assert reasons.isin(["instance_failed", "transfer_timeout", "stalled",
                         "context exceeds the instance's KV memory"]).all()
