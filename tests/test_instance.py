"""The batching engine on hand-computable cases (iteration time = 0.01 s + 1e-5 s per token)."""

import numpy as np
import pytest
import simpy

from pddsim import catalog
from pddsim.config import DEFAULT_ENGINE, from_dict
from pddsim.engine.instance import Instance, Segment
from pddsim.engine.job import Job
from pddsim.engine.perf import LinearRun
from pddsim.engine.request import Request
from pddsim.sim import simulate
from pddsim.system.stages import PREFILL_QUEUE

BASE, PER = 0.01, 1e-5


def utilization_for(kv_tokens: int) -> float:
    """The HBM share that leaves `kv_tokens` of KV room beside llama-3.1-70b's weights on 8 H100s."""
    m = catalog.model("llama-3.1-70b")
    return (m.weight_bytes + (kv_tokens + 8) * m.kv_bytes_per_token) / (8 * 80e9)


def it(tokens):
    return BASE + PER * tokens


def test_colocated_single_request_times(make_config, make_workload):
    cfg = make_config(roles=(("colocated", 1),))
    r = simulate(cfg, make_workload((0.0, 100, 5))).requests.iloc[0]
    assert r.ttft_s == pytest.approx(it(100))                 # one prefill iteration
    assert r.e2e_s == pytest.approx(it(100) + 4 * it(1))      # four one-token decode iterations
    assert r.tpot_s == pytest.approx(it(1))
    assert r.tokens_out == 5


def test_chunked_prefill_takes_one_iteration_per_chunk(make_config, make_workload):
    cfg = make_config(roles=(("colocated", 1),), batching={"prefill_chunk": 300})
    r = simulate(cfg, make_workload((0.0, 1000, 1))).requests.iloc[0]
    assert r.ttft_s == pytest.approx(3 * it(300) + it(100))


def test_arrival_mid_decode_joins_at_the_next_iteration_boundary(make_config, make_workload):
    cfg = make_config(roles=(("colocated", 1),))
    # A: prefill 100 tok (ends 0.011), then decodes alone at 0.01001 s/iter.
    # B arrives at 0.05: the iteration in flight ends at 0.011 + 4*0.01001 = 0.05104; B's 50-token
    # prefill shares the next iteration with A's decode token (51 tokens).
    res = simulate(cfg, make_workload((0.0, 100, 20), (0.05, 50, 3))).requests
    a, b = res.iloc[0], res.iloc[1]
    boundary = it(100) + 4 * it(1)
    assert b.ttft_s == pytest.approx(boundary + it(51) - 0.05)
    # A produced 20 tokens: 1 at prefill, 4 alone, 1 in the mixed iteration, 2 beside B's decode,
    # then 12 alone again
    assert a.e2e_s == pytest.approx(boundary + it(51) + 2 * it(2) + 12 * it(1))
    assert a.itl_max_s == pytest.approx(it(51))
    assert a.tokens_out == 20 and b.tokens_out == 3


def test_pd_first_token_arrives_with_the_kv(make_config, make_workload):
    cfg = make_config()
    res = simulate(cfg, make_workload((0.0, 1000, 3)))
    r = res.requests.iloc[0]
    kv = 1000 * 327_680                                           # llama-3.1-70b bytes per token
    transfer = kv / (400e9 / 8)
    assert r.ttft_s == pytest.approx(it(1000) + transfer)
    assert r.e2e_s == pytest.approx(it(1000) + transfer + 2 * it(1))
    assert r.rdma_bytes == kv
    assert res.links["rdma:a"]["bytes"] == pytest.approx(kv)


def test_memory_pressure_preempts_and_recomputes_but_every_token_arrives(make_config, make_workload):
    cfg = make_config(roles=(("colocated", 1),),
                 batching={"memory_utilization": utilization_for(1408), "kv_block_tokens": 16})
    reqs = [(0.001 * i, 300, 400) for i in range(6)]
    res = simulate(cfg, make_workload(*reqs))
    df = res.requests
    assert (df.status == "completed").all()
    assert (df.tokens_out == df.output_tokens).all()
    assert res.instances.preemptions.sum() > 0


def test_request_larger_than_memory_fails_with_a_reason(make_config, make_workload):
    cfg = make_config(roles=(("colocated", 1),),
                 batching={"memory_utilization": utilization_for(1408)})
    df = simulate(cfg, make_workload((0.0, 50_000, 2), (0.0, 100, 2))).requests
    assert list(df.status) == ["failed", "completed"]
    assert "KV memory" in df.failure.iloc[0]


def test_one_server_one_at_a_time_matches_md1(make_config, make_workload):
    """max_batch 1, one-token outputs, constant service D: the M/D/1 queue.
    Mean time in system = D + rho * D / (2 (1 - rho))."""
    d = it(1000)
    lam = 0.7 / d
    rng = np.random.default_rng(7)
    n = 20000
    arrivals = np.cumsum(rng.exponential(1 / lam, n))
    cfg = make_config(roles=(("colocated", 1),), batching={"max_batch": 1})
    df = simulate(cfg, make_workload(*[(float(t), 1000, 1) for t in arrivals])).requests
    rho = lam * d
    expected = d + rho * d / (2 * (1 - rho))
    assert df.e2e_s.mean() == pytest.approx(expected, rel=0.05)


@pytest.mark.parametrize("gap_s", [0.003, 0.02, 0.1])
def test_kv_in_use_never_exceeds_the_pool_with_prefill_beside_decode(make_config, make_workload, gap_s):
    # A 1,408-token pool and a stream of arrivals: prompts keep being prefilled while earlier
    # requests decode, so decoders grow in mixed iterations too, not only in decode-only runs.
    cfg = make_config(roles=(("colocated", 1),),
                      batching={"memory_utilization": utilization_for(1408), "kv_block_tokens": 16})
    res = simulate(cfg, make_workload(*[(gap_s * i, 200 + 7 * i, 150) for i in range(24)]))
    inst = res.instances.iloc[0]
    assert inst.kv_capacity_tokens == 1408
    assert 0 < inst.kv_peak_tokens <= inst.kv_capacity_tokens
    assert (res.requests.tokens_out == res.requests.output_tokens).all()


def test_iterations_in_flight_are_those_ended_by_now_exactly():
    """What a router sees of a decode run under way: the iterations ended at or before now, the
    same count as over the exact prefix sums, now on a boundary, between two, or past the end."""
    rng = np.random.default_rng(5)
    for _ in range(400):
        k = int(rng.integers(1, 120))
        run = LinearRun((rng.uniform(1e-3, 0.05), float(rng.choice([0.0, 1e-5]))),
                        (rng.uniform(1e-3, 0.05), float(rng.uniform(0, 1e-4))),
                        rng.uniform(0, 0.01), k)
        ends = [run.elapsed(m) for m in range(1, k + 1)]
        t0 = float(rng.choice([0.0, rng.uniform(0, 1e4)]))
        for t in [0.0, *rng.choice(ends, 3), *rng.uniform(0, run.total_s * 1.2, 3)]:
            seg = Segment().start((), run, k, run.total_s, t0, 0)
            ended = sum(1 for e in ends if e <= (t0 + t) - t0)
            assert seg.iters_done(t0 + t) == ended
            assert seg.iters_done(t0 + t) == ended       # asked again at the same instant


class _QuarterSecond:
    """A performance model whose every iteration takes 0.25 s: boundaries are exact binary times."""

    def iteration(self, tokens, attn_pairs, kv_tokens_read, decode_pairs=0.0):
        return 0.25

    def decode_run(self, n, context, k):
        return LinearRun((0.25, 0.0), (0.0, 0.0), 0.0, k)


def _job(req, at, env):
    """A job that notes when its request finished, with how many tokens."""
    def finished(job):
        at[job.req.idx] = (env.now, job.req.tokens_out)
    return Job(req, on_finished=finished, on_failed=None)


@pytest.mark.parametrize("arrival", [1.0, 1.1])
def test_work_arriving_on_a_boundary_joins_there(make_config, arrival):
    # A decodes 10 tokens at 0.25 s an iteration. B arrives 4 iterations in, exactly on the
    # boundary (the run ends now, from an urgent event: never inside the arrival's caller) or
    # between two (it ends at the next, 1.25): B's 3 tokens follow from there.
    env = simpy.Environment()
    at: dict = {}
    inst = Instance(env, "d", "decode", "a", perf=_QuarterSecond(), prefill_side=False,
                    kv_capacity_tokens=10**6,
                    batching=make_config().batching.under(catalog.engine(DEFAULT_ENGINE)), cache=None)
    a = Request(0, 100, 10, (), 512, 0.0, PREFILL_QUEUE)
    inst.submit(_job(a, at, env), prefill=0, decode=10, context=100)
    b = Request(1, 50, 3, (), 512, arrival, PREFILL_QUEUE)
    env.timeout(arrival).callbacks.append(
        lambda _e: inst.submit(_job(b, at, env), prefill=0, decode=3, context=50))
    env.run()
    joins = 1.0 if arrival == 1.0 else 1.25
    assert at == {0: (2.5, 10), 1: (joins + 0.75, 3)}


class _Recording(_QuarterSecond):
    """Notes the attention pairs each iteration is priced for."""

    def __init__(self):
        self.pairs: list[float] = []

    def iteration(self, tokens, attn_pairs, kv_tokens_read, decode_pairs=0.0, requests=None,
                  samples=None, largest=None):
        self.pairs.append(attn_pairs)
        return 0.25

    def iterations(self, tokens, attn_pairs, kv_tokens_read, decode_pairs=0.0, requests=None,
                   samples=None, largest=None):
        self.pairs.extend(attn_pairs.tolist())
        return np.full(len(tokens), 0.25)


def test_a_chunk_is_priced_by_one_attention_formula_in_the_engine_and_in_estimates(make_config):
    """A lone 1,000-token prompt over 200 cached tokens in chunks of 256: the engine and the
    sessions' unloaded estimate price the same chunks for the same pairs, the one function's."""
    from pddsim.engine.perf import chunk_attention_pairs
    from pddsim.sessions import _prefill_s
    env = simpy.Environment()
    engine = _Recording()
    batching = make_config(batching={"prefill_chunk": 256, "token_budget": 256}).batching
    inst = Instance(env, "p", "prefill", "a", perf=engine, prefill_side=True, kv_capacity_tokens=10**6,
                    batching=batching.under(catalog.engine(DEFAULT_ENGINE)), cache=None)
    req = Request(0, 1200, 1, (), 512, 0.0, PREFILL_QUEUE)
    inst.submit(Job(req, on_held=lambda job: None, on_failed=None), prefill=1000, decode=0,
                context=200, hold=True)
    env.run()
    estimate = _Recording()
    _prefill_s(estimate, np.array([200]), np.array([1000]), 256)
    expected = [chunk_attention_pairs(200 + done, min(256, 1000 - done)) for done in range(0, 1000, 256)]
    assert engine.pairs == estimate.pairs == expected


def _balanced(make_config, timeout: int, wait: int = 0):
    """A colocated worker of two attention data-parallel ranks, balancing prompts under
    `timeout` and `wait` (0: not at all)."""
    cfg = make_config(roles=(("colocated", 1),), perf__dp_balance_timeout_iters=timeout,
                      perf__dp_balance_wait_iters=wait)
    raw = cfg.model_dump(exclude={"base_dir"})
    raw["clusters"]["a"]["instances"][0].update(tp=4, dp=2)
    return from_dict(raw, "t")


@pytest.mark.parametrize("timeout, waits", [(0, 0.5), (5, 2.5), (3, 0.5)])
def test_a_lone_prompt_waits_for_the_balance_counter_to_turn(make_config, make_workload,
                                                             timeout, waits):
    """A and B take both ranks (a worker with an idle rank takes prompts at once: their first
    tokens come after one prefill iteration). C arrives 1.5 decode iterations later, a prompt
    for one rank only: balancing holds it until the counter, which has run since the decoding
    began, reaches its timeout (5: after the 4th decode iteration; 3: after the 2nd, the boundary
    C reaches first), where without balancing it joins at the next boundary."""
    cfg = _balanced(make_config, timeout)
    start, decode = it(20), it(2)
    r = simulate(cfg, make_workload((0.0, 10, 100), (0.0, 10, 100),
                                    (start + 1.5 * decode, 10, 5))).requests
    assert r.ttft_s.iloc[0] == r.ttft_s.iloc[1] == pytest.approx(start)
    assert r.ttft_s.iloc[2] == pytest.approx(waits * decode + it(12))


def test_prompts_on_every_rank_are_held_to_gather_more_while_every_rank_decodes(make_config,
                                                                                make_workload):
    """Two prompts, one a rank, arriving while both ranks decode are held `wait` = 3 iterations
    (one at a time), then join together; the counter's timeout (50) plays no part."""
    cfg = _balanced(make_config, 50, 3)
    start, decode = it(20), it(2)
    arrive = start + 1.5 * decode
    r = simulate(cfg, make_workload((0.0, 10, 100), (0.0, 10, 100),
                                    (arrive, 10, 5), (arrive, 10, 5))).requests
    joins = start + 5 * decode                     # the boundary after 2, then 3 held iterations
    assert r.ttft_s.iloc[2] == r.ttft_s.iloc[3] == pytest.approx(joins + it(22) - arrive)
