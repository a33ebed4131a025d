"""Exactness of the pool index: in random deployments serving random workloads, every pick a
router makes through a pool's index is the instance a scan of the pool's list picks (least work,
then least KV load, then the first), whatever the queues, decode runs and caches hold at that
moment; the caches' hooks keep the block index equal to what they hold."""
import random

import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_properties import workloads as random_workloads

from pddsim.config import from_dict
from pddsim.engine.prefix_cache import PrefixCache
from pddsim.engine.request import Request
from pddsim.sim import simulate
from pddsim.system import routers
from pddsim.system.deployment import build
from pddsim.system.pool import Pool
from pddsim.system.stages import PREFILL_QUEUE
from pddsim.workload.model import TraceRequest, Workload


class Checked:
    """A router of `policy` that picks through a `Pool`'s index whatever the pool's size, asserting
    each pick is the one a scan of the pool's list makes; `picks` counts them."""

    def __init__(self, policy, picks: dict):
        self.router = policy(scan_up_to=0)
        self.picks = picks

    def pick(self, instances, req):
        fast = self.router.pick(instances, req)
        assert isinstance(instances, Pool)
        scan = self.router.pick(list(instances), req)   # a list has no index: scanned
        assert fast is scan, (req.idx, fast.name, scan.name)
        self.picks["index"] += 1
        if req.hash_ids and instances.routing.holders(req.hash_ids[0]):
            self.picks["holders"] += 1
        return fast


def run_checked(cfg, workload, seed=0):
    """Run with each pool's router checked (`Checked`); the picks per policy."""
    picks = {name: {"index": 0, "holders": 0} for name in ("cache_affinity", "least_loaded")}

    def check_routers(env, dep, pipeline):
        for pool in pipeline.routers:
            name = getattr(cfg.policies, f"{pool}_router")
            if name in picks:
                pipeline.routers[pool] = Checked(routers.ROUTERS[name], picks[name])
    simulate(cfg, workload, seed=seed, on_built=check_routers)
    return picks


ROUTER = st.sampled_from(("cache_affinity", "least_loaded"))


@st.composite
def deployments(draw):
    system = draw(st.sampled_from(("colocated", "pd", "pdd")))

    def group(role):   # up to 12 instances of 2 GPUs (~8.5k tokens of KV: queues, preemption)
        return {"role": role, "count": draw(st.integers(1, 12)), "tp": draw(st.sampled_from((2, 8)))}
    rdma = {"bandwidth_gbps": draw(st.sampled_from((100, 400))), "rtt_ms": 0.02}
    if system == "colocated":
        clusters = {"a": {"gpu": "h100-sxm", "rdma": rdma, "instances": [group("colocated")]}}
    elif system == "pd":
        clusters = {"a": {"gpu": "h100-sxm", "rdma": rdma, "instances": [group("prefill"), group("decode")]}}
    else:
        clusters = {"a": {"gpu": "h100-sxm", "rdma": rdma, "instances": [group("prefill"), group("relay")]},
                    "b": {"gpu": "h100-sxm", "rdma": rdma, "instances": [group("decode")]}}
    raw = {"name": "pool", "model": "llama-3.1-70b", "clusters": clusters,
           "slo": {"ttft_s": 1.0, "tpot_s": 0.05}, "workload": {"trace": "unused.jsonl"},
           "prefix_cache": {"decode_tokens": draw(st.sampled_from((0, 4096, None))),
                            "prefill_tokens": draw(st.sampled_from((2048, None)))},
           "batching": {"max_batch": draw(st.sampled_from((2, 8, 64))),
                        "coalesce_decode": draw(st.booleans())},
           "policies": {"prefill_router": draw(ROUTER), "decode_router": draw(ROUTER),
                        "relay_router": draw(ROUTER)}}
    if draw(st.booleans()):      # instances fail and come back: pools lose and regain members
        roles = [g["role"] for c in clusters.values() for g in c["instances"]]
        raw["faults"] = {"random": [{"role": draw(st.sampled_from(roles)), "mtbf_s": 0.5, "mttr_s": 0.2}]}
    if system == "pdd":
        raw["wan"] = {"bandwidth_gbps": draw(st.sampled_from((10, 100))), "rtt_ms": 20}
        raw["pdd"] = {"handoff": draw(st.sampled_from(("one_shot", "catch_up")))}
    return from_dict(raw, "pool")


def workloads():
    """Up to 40 requests, often at one instant, over 6 prefix chains: picks among many holders."""
    return random_workloads(chains=6, blocks=60, requests=40,
                            gaps=st.sampled_from((0.0, 0.001, 0.05, 0.3)), outputs=300)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=deployments(), w=workloads(), seed=st.integers(0, 3))
def test_every_pick_through_the_index_is_the_scans(cfg, w, seed):
    run_checked(cfg, w, seed)


def test_sessions_on_a_large_pool_pick_as_the_scan_does_and_use_the_block_index(make_config):
    # 16 prefill and 16 decode instances with decode-side caches, sessions re-sending their
    # growing contexts: most picks weigh a few holders of the prefix against the index's best.
    cfg = make_config(roles=(("prefill", 16), ("decode", 16)), prefix_cache={"decode_tokens": None},
                      clusters__a__rdma={"bandwidth_gbps": 400, "rtt_ms": 0.02},
                      policies={"decode_router": "cache_affinity"}, batching={"max_batch": 8})
    rng = random.Random(3)
    reqs, t = [], 0.0
    contexts = {s: [] for s in range(24)}
    for _ in range(400):
        t += rng.expovariate(40.0)
        s = rng.randrange(24)
        contexts[s] += [s * 10_000 + len(contexts[s]) + i for i in range(rng.randint(1, 8))]
        reqs.append(TraceRequest(arrival_s=t, input_tokens=100 * len(contexts[s]),
                                 output_tokens=rng.randint(1, 200), hash_ids=tuple(contexts[s]),
                                 block_tokens=100))
    picks = run_checked(cfg, Workload(reqs))
    assert picks["cache_affinity"]["holders"] > 300     # both pools, most turns after the first


def test_an_instance_that_left_is_not_picked_until_it_is_back_at_its_place(make_config):
    cfg = make_config(roles=(("prefill", 3), ("decode", 1)))
    pool = build(simpy.Environment(), cfg, seed=0).pools["prefill"]
    first = pool[0]
    req = Request(0, 200, 1, (7, 8), 100, 0.0, PREFILL_QUEUE)
    affinity, least = routers.CacheAffinity(scan_up_to=0), routers.LeastLoaded(scan_up_to=0)
    assert least.pick(pool, req) is first               # all idle: the first
    pool.remove(first)
    assert least.pick(pool, req) is pool[0]
    first.cache.insert(req.hash_ids, 100)               # what it holds does not attract work now
    assert affinity.pick(pool, req) is pool[0]
    pool[1].cache.insert(req.hash_ids, 100)            # nor when the pick is a scan
    assert affinity.pick(pool, req) is pool[1]
    pool.add(first)
    assert pool[0] is first                             # back at its place, its cache indexed
    assert affinity.pick(pool, req) is first
    assert least.pick(pool, req) is first


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(("insert", "evict", "pin")), st.integers(0, 5),
                              st.integers(1, 12)), max_size=40),
       capacity=st.sampled_from((None, 600, 1500)))
def test_cache_hooks_report_exactly_what_the_cache_holds(ops, capacity):
    cache, held, pinned = PrefixCache(capacity), set(), []
    cache.on_added = held.update
    cache.on_removed = held.difference_update
    chains = [tuple(range(c * 100, c * 100 + 12)) for c in range(6)]
    for op, c, n in ops:
        chain = chains[c][:n]
        if op == "insert":
            cache.insert(chain, 100, None)
        elif op == "evict":
            cache.evict(100 * n)
        else:
            if pinned:
                cache.unpin(*pinned.pop())
            k = cache.match(chain)
            cache.pin(chain, k)
            pinned.append((chain, k))
        assert held == set(cache.blocks())


def test_the_block_map_built_late_is_what_the_members_in_service_hold(make_config):
    """No block map (and no cache hooks) until a router asks; built after caches filled, members
    left and came back with new blocks, it is what the members in service hold, and it follows
    their caches from then on."""
    cfg = make_config(roles=(("prefill", 4), ("decode", 1)))
    pool = build(simpy.Environment(), cfg, seed=0).pools["prefill"]
    chains = [tuple(range(c * 100, c * 100 + 8)) for c in range(5)]
    for i, inst in enumerate(pool):
        inst.cache.insert(chains[i], 100)
        inst.cache.insert(chains[4][:i + 1], 100)
    gone = pool[1]
    pool.remove(gone)
    gone.cache.insert(chains[0], 100)                   # out of service: never a holder
    pool[2].cache.evict(100)                            # pool[2] is the member at position 3
    assert all(inst.cache.on_added is None for inst in pool.routing.members)

    def truth(block):
        return {pool.routing.position(inst) for inst in pool if block in inst.cache.blocks()}

    blocks = {b for chain in chains for b in chain}
    assert {b: pool.routing.holders(b) for b in blocks} == {b: truth(b) for b in blocks}
    pool.add(gone)
    pool[0].cache.evict(10**6)
    pool[3].cache.insert(chains[1], 100)
    assert {b: pool.routing.holders(b) for b in blocks} == {b: truth(b) for b in blocks}
    assert pool.routing.holders(chains[0][0]) == {1}


def test_pools_small_enough_to_scan_keep_no_block_map(make_config):
    built = []
    cfg = make_config(roles=(("prefill", 3), ("decode", 2)))
    w = Workload([TraceRequest(arrival_s=0.1 * i, input_tokens=300, output_tokens=4,
                               hash_ids=(i % 3, 10 + i), block_tokens=200) for i in range(30)])
    res = simulate(cfg, w, on_built=lambda env, dep, pipeline: built.append(dep))
    assert res.summary["requests_completed"] == 30 and res.summary["prefix_hit_rate"] > 0
    caches = [i.cache for pool in built[0].pools.values() for i in pool if i.cache is not None]
    assert caches and all(c.on_added is None and c.on_removed is None for c in caches)   # no hooks
