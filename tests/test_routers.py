"""What routers see: queued work net of prefix hits, loads current within a decode segment."""
from pathlib import Path

import numpy as np
import simpy

from pddsim.config import load_config
from pddsim.engine.instance import Instance
from pddsim.engine.job import Job
from pddsim.engine.perf import MeasuredTable
from pddsim.engine.request import Request
from pddsim.sim import load_workload, simulate
from pddsim.system.stages import PREFILL_QUEUE

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

PREFIX = tuple(range(1, 101))                     # a session's context: 100 blocks of 100 tokens


def test_a_queue_of_cache_hits_does_not_push_the_next_turn_away_from_its_prefix(make_config, make_workload):
    # P0 computes the session's context first; then turns re-sending it arrive 1 ms apart while
    # P0 runs one request at a time. Each queued turn costs P0 only its 100 uncached tokens, so
    # every turn stays where its 10,000-token prefix is cached (P1 would recompute all of it).
    cfg = make_config(roles=(("prefill", 2), ("decode", 1)), batching={"max_batch": 1})
    turns = [(1.0 + 0.001 * i, 10_100, 1, PREFIX + (1000 + i,), 100) for i in range(5)]
    df = simulate(cfg, make_workload((0.0, 10_000, 1, PREFIX, 100), *turns)).requests
    assert list(df.hit_tokens[1:]) == [10_000] * 5


def test_prefill_hit_rate_holds_as_load_rises_while_every_cache_holds_the_working_set():
    # The paper's same-DC deployment in closed loop, 60 short sessions: each prefill cache (20M
    # tokens) holds every context, so a turn misses only when routed away from its prefix. Raising
    # the session rate 8x (SLO still met) must not push turns away: queues of cache hits are short.
    # The horizons keep the same sessions at both rates (they share their draws); at 8x the load
    # the router sends a few more turns away from their prefix (1.5 points measured), not many.
    def hit_rate(session_rate, horizon_s):
        cfg = load_config(CONFIGS / "paper" / "same_dc_pd.yaml", [
            "workload.replay=closed", f"workload.horizon_s={horizon_s}",
            "workload.synthetic.knobs.turns_mean=10", "workload.synthetic.knobs.output_mean=300",
            f"workload.session_rate_rps={session_rate}"])
        summary = simulate(cfg, load_workload(cfg), 0).summary
        assert summary["slo_attainment"] >= cfg.slo.target
        return summary["prefix_hit_rate"]

    assert hit_rate(0.4, 150) >= hit_rate(0.05, 1200) - 0.025


def test_a_decoder_shows_the_iterations_of_its_decode_run_under_way(tmp_path, make_config):
    # Two requests decode for hundreds of iterations; whenever a router looks, the decoder's
    # context and KV load must be what a one-iteration-at-a-time engine shows at that moment.
    seen = {}
    for coalesce in (True, False):
        cfg = make_config(batching={"coalesce_decode": coalesce})
        env = simpy.Environment()
        inst = Instance(env, "d", "decode", "a", perf=MeasuredTable(tmp_path / "perf.csv"),
                        prefill_side=False, kv_capacity_tokens=10**6,
                        batching=cfg.batching.under(cfg.perf.engine_profile()), cache=None)
        for i, (context, out) in enumerate(((1000, 400), (3000, 250))):
            req = Request(i, context, out, (), 512, 0.0, PREFILL_QUEUE)
            inst.submit(Job(req, on_finished=lambda job: None, on_failed=None), prefill=0, decode=out,
                        context=context)
        seen[coalesce] = []
        for t in np.linspace(0.0123, 4.5, 29):
            env.run(until=t)
            seen[coalesce].append((inst.decode_context, inst.kv_load))
            assert inst.kv_load_floor <= inst.kv_load <= inst.kv_load_ceiling
    assert seen[True] == seen[False]
    assert seen[True][5][0] > 4000                  # the decoders' contexts grew meanwhile


def test_least_loaded_is_min_over_work_then_load():
    """Exactness: the lazy tie-break, deciding on load bounds where they suffice, picks what
    `min` over (work, kv_load) pairs picks."""
    from pddsim.system.routers import least_loaded

    class Stub:
        def __init__(self, work, load, below, above):
            self.work, self.kv_load = work, load
            self.kv_load_floor, self.kv_load_ceiling = load - below, load + above

    rng = np.random.default_rng(5)
    for _ in range(2000):
        pool = [Stub(*(int(x) for x in rng.integers(0, 3, 4)))
                for _ in range(int(rng.integers(1, 8)))]
        assert least_loaded(pool, lambda i: i.work) is min(pool, key=lambda i: (i.work, i.kv_load))
