"""Prefix caches take memory: in HBM they share the KV pool (unused cached blocks go before a
request waits or a decoder is preempted; blocks in use are never evicted), in host memory a hit
pays its load time. Linear performance table: iteration time = 0.01 s + 1e-5 s per token."""
import numpy as np
import pytest

from pddsim import catalog
from pddsim.cli import main
from pddsim.engine.instance import Instance
from pddsim.sim import simulate

BLOCK = 16


def utilization_for(kv_tokens: int) -> float:
    """The HBM share that leaves `kv_tokens` of KV room beside llama-3.1-70b's weights on 8 H100s."""
    m = catalog.model("llama-3.1-70b")
    return (m.weight_bytes + (kv_tokens + 8) * m.kv_bytes_per_token) / (8 * 80e9)


def chain(first: int, tokens: int) -> list[int]:
    return list(range(first, first + tokens // BLOCK))


def watched(cfg, workload, check):
    """Run with the engine's checks on and `check(deployment)` after every event as well; the
    result and the deployment, to look inside its instances."""
    built = []

    def on_built(env, dep, pipeline):
        built.append(dep)
        env.checks.append(lambda: check(dep))
    return simulate(cfg, workload, check_invariants=True, on_built=on_built), built[0]


class Evictions:
    """Tokens the caches of a deployment gave up, as seen after every event (called with it then):
    in a run without crashes only eviction shrinks a cache, so this counts at most what they
    evicted."""

    def __init__(self) -> None:
        self.last: dict = {}
        self.tokens = 0

    def __call__(self, dep) -> None:
        for inst in (i for pool in dep.members.values() for i in pool if i.cache is not None):
            was = self.last.get(inst.cache, inst.cache.used_tokens)
            self.tokens += max(0, was - inst.cache.used_tokens)
            self.last[inst.cache] = inst.cache.used_tokens


def physical_kv(inst: Instance) -> int:
    """KV tokens in the pool from first principles: every resident block of an HBM cache once,
    plus what each running request holds beyond the cached blocks it pins."""
    pinned = sum(n * r.block_tokens for r, n in inst._pinned.items()
                 if r not in inst.waiting) if inst._cache_in_hbm else 0
    cached = inst.cache.used_tokens if inst._cache_in_hbm else 0
    return inst.held + inst.decode_context + cached - pinned


def agent_turns(n_sessions: int, turns: int, rng) -> list:
    """Sessions whose turns re-send a growing context after a shared system prompt."""
    reqs, system = [], chain(0, 256)
    for s in range(n_sessions):
        own, t = [], float(rng.uniform(0, 2))
        for _ in range(turns):
            own += chain(10_000 * (s + 1) + len(own), int(rng.integers(1, 6)) * BLOCK * 4)
            ids = system + own
            reqs.append((t, len(ids) * BLOCK, int(rng.integers(20, 200)), ids, BLOCK))
            t += float(rng.uniform(0.3, 1.5))
    return sorted(reqs)


@pytest.mark.parametrize("roles", [(("colocated", 2),), (("prefill", 1), ("decode", 2))])
def test_memory_is_never_over_committed_with_caches_and_running_requests(make_config, make_workload,
                                                                          roles):
    """Colocated, and PD with HBM caches on both sides (the decoders' DRC fed by every landed
    prompt)."""
    cfg = make_config(roles=roles, prefix_cache={"decode_tokens": None},
                 policies={"decode_router": "cache_affinity"},
                 batching={"memory_utilization": utilization_for(6000), "kv_block_tokens": BLOCK})
    over, events, evictions = [], [], Evictions()

    def memory(dep):
        """Every instance's memory, from first principles, after every event."""
        events.append(1)
        evictions(dep)
        over.extend((i.name, physical_kv(i), i.capacity) for pool in dep.members.values()
                    for i in pool if physical_kv(i) > i.capacity)
    res, dep = watched(cfg, make_workload(*agent_turns(12, 6, np.random.default_rng(3))), memory)
    df = res.requests
    assert (df.status == "completed").all() and (df.tokens_out == df.output_tokens).all()
    assert df.hit_tokens.sum() > 0
    assert evictions.tokens > 0                                   # the pool was the limit
    assert len(events) > 100 and over == []
    for pool in dep.pools.values():                    # every pin and byte given back
        for inst in pool:
            assert inst.held == 0 and inst.decode_context == 0 and inst._shared == 0
            assert inst.cache is None or inst.cache.pinned_tokens == 0


def test_cached_blocks_are_evicted_before_a_decoder_is_preempted(make_config, make_workload):
    """E's blocks are cached and unused, A's are pinned by B (its prefix): as B and C grow, E's
    go first, then a decoder is preempted, never B's pinned prefix."""
    cfg = make_config(roles=(("colocated", 1),),
                 batching={"memory_utilization": utilization_for(1000), "kv_block_tokens": BLOCK})
    a, b, e = chain(0, 320), chain(0, 320) + [100], chain(300, 160)
    at_preemption, last, evictions = [], {"preemptions": 0, "cache": None}, Evictions()

    def record(dep):
        """The cache as the run came to each event that preempted a decoder (a decode run takes
        the room it grows into, evicting, when it is planned: at the end of an earlier event)."""
        evictions(dep)
        inst = dep.pools["colocated"][0]
        if inst.preemptions > last["preemptions"]:
            at_preemption.append(last["cache"])
        last.update(preemptions=inst.preemptions,
                    cache=(inst.cache.evictable_tokens, inst.cache.match(b)))
    res, dep = watched(cfg, make_workload((0.0, 320, 2, a, BLOCK), (0.0, 160, 2, e, BLOCK),
                                          (1.0, 336, 400, b, BLOCK), (1.0, 320, 400, chain(200, 320), BLOCK)),
                       record)
    df = res.requests
    assert (df.tokens_out == df.output_tokens).all()
    assert df.hit_tokens.iloc[2] == 320
    assert at_preemption and all(evictable == 0 for evictable, _ in at_preemption)
    assert at_preemption[0][1] == len(b)            # B's blocks, pinned, still resident
    assert evictions.tokens >= 160


def test_an_hbm_cache_yields_its_room_to_requests(make_config, make_workload):
    """Cached blocks nobody uses cost running requests nothing: a request that needs their room
    runs as if there were no cache (same times, no preemption)."""
    def run(cache_tokens):
        cfg = make_config(roles=(("colocated", 1),), prefix_cache={"prefill_tokens": cache_tokens},
                     batching={"memory_utilization": utilization_for(1000), "kv_block_tokens": BLOCK})
        return simulate(cfg, make_workload((0.0, 480, 2, chain(0, 480), BLOCK),
                                      (1.0, 300, 600, chain(1000, 304), BLOCK)))
    cached, bare = run(None), run(0)
    assert cached.requests.e2e_s.tolist() == pytest.approx(bare.requests.e2e_s.tolist(), abs=1e-12)
    assert cached.instances.preemptions.sum() == 0


def test_a_host_tier_hit_pays_its_load_time(make_config, make_workload):
    kv = catalog.model("llama-3.1-70b").kv_bytes_per_token
    ids = chain(0, 1600)
    reqs = make_workload((0.0, 1600, 2, ids, BLOCK), (5.0, 1616, 2, ids + [9999], BLOCK))

    def ttft(tier, **cluster):
        cfg = make_config(roles=(("colocated", 1),),
                     prefix_cache={"prefill_tokens": 100_000, "prefill_tier": tier}, **cluster)
        return simulate(cfg, reqs).requests

    hbm = ttft("hbm")
    host = ttft("host", clusters__a__host_memory={"capacity_gb": 100, "load_gb_per_s": 10})
    assert hbm.hit_tokens.iloc[1] == host.hit_tokens.iloc[1] == 1600
    assert host.ttft_s.iloc[0] == pytest.approx(hbm.ttft_s.iloc[0])           # a miss loads nothing
    assert host.ttft_s.iloc[1] - hbm.ttft_s.iloc[1] == pytest.approx(1600 * kv / 10e9)


def test_two_loads_share_the_host_link(make_config, make_workload):
    kv = catalog.model("llama-3.1-70b").kv_bytes_per_token
    x, y = chain(0, 800), chain(5000, 800)
    cfg = make_config(roles=(("colocated", 1),),
                 prefix_cache={"prefill_tokens": 100_000, "prefill_tier": "host"},
                 clusters__a__host_memory={"capacity_gb": 100, "load_gb_per_s": 10})
    one = simulate(cfg, make_workload((0.0, 800, 2, x, BLOCK), (5.0, 816, 2, x + [-1], BLOCK))).requests
    two = simulate(cfg, make_workload((0.0, 800, 2, x, BLOCK), (0.0, 800, 2, y, BLOCK),
                                 (5.0, 816, 2, x + [-1], BLOCK), (5.0, 816, 2, y + [-2], BLOCK))).requests
    load = 800 * kv / 10e9
    # alone: the load; together both loads end at twice that, and then share one prefill iteration
    assert one.ttft_s.iloc[1] == pytest.approx(load + 0.01 + 16e-5)
    assert two.ttft_s.iloc[2:].tolist() == pytest.approx([2 * load + 0.01 + 32e-5] * 2)


@pytest.mark.parametrize("sets, fragments", [
    (["prefix_cache.prefill_tokens=2000000"], ["prefix_cache.prefill_tokens", "KV pool"]),
    (["prefix_cache.decode_tokens=2000000"], ["prefix_cache.decode_tokens", "KV pool"]),
    (["prefix_cache.prefill_tier=host"], ["prefix_cache.prefill_tier", "host_memory"]),
    (["prefix_cache.prefill_tier=host", "clusters.a.host_memory={capacity_gb: 10, load_gb_per_s: 5}",
      "prefix_cache.prefill_tokens=100000"], ["prefix_cache.prefill_tokens", "host memory"]),
])
def test_a_cache_larger_than_its_tier_is_rejected(make_config, input_error, tmp_path, capsys, sets,
                                                  fragments):
    import yaml
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(make_config().model_dump(exclude={"base_dir"})))
    args = ["validate", str(path)] + [a for s in sets for a in ("--set", s)]
    code = main(args)
    input_error(code, capsys.readouterr().err, *fragments)
