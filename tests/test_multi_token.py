"""Multi-token decoding (MTP / speculative): exact iteration times on hand-computable cases, the
acceptance extremes, conservation across the pipelines, determinism, and DeepSeek-V3's report."""
import numpy as np
import pandas as pd
import pytest
import simpy
import yaml
from test_instance import utilization_for

from pddsim import catalog
from pddsim.cli import main
from pddsim.config import DEFAULT_ENGINE, SpecDecode, from_dict
from pddsim.engine.instance import Instance
from pddsim.engine.job import Job
from pddsim.engine.multi_token import MultiToken
from pddsim.engine.perf import LinearRun, Roofline
from pddsim.engine.request import Request
from pddsim.sim import load_workload, simulate
from pddsim.workload.model import TraceRequest, Workload
from pddsim.workload.synthetic import poisson_workload

BASE, PER_TOKEN, PER_KV = 0.01, 1e-4, 1e-6


class _Linear:
    """Every iteration takes BASE + PER_TOKEN x tokens computed + PER_KV x KV tokens read."""

    def iteration(self, tokens, attn_pairs, kv_tokens_read, decode_pairs=0.0, requests=None,
                  samples=None, largest=None):
        return BASE + PER_TOKEN * tokens + PER_KV * kv_tokens_read

    def iterations(self, tokens, attn_pairs, kv_tokens_read, decode_pairs=0.0, requests=None,
                   samples=None, largest=None):
        return BASE + PER_TOKEN * np.asarray(tokens, float) + PER_KV * np.asarray(kv_tokens_read, float)

    def decode_run(self, n, context, k):
        return LinearRun((BASE + PER_TOKEN * n + PER_KV * context, PER_KV * n), (0.0, 0.0), 0.0, k)


def t(tokens, kv):
    return BASE + PER_TOKEN * tokens + PER_KV * kv


def decode_alone(make_config, jobs, spec=None):
    """Decoders joining at 0 with (context, tokens) each: {request: (finish time, tokens out)}."""
    env = simpy.Environment()
    multi = None if spec is None else MultiToken(SpecDecode(**spec), _Linear(), np.random.default_rng(0))
    inst = Instance(env, "d", "decode", "a", perf=_Linear(), prefill_side=False, kv_capacity_tokens=10**6,
                    cache=None,
                    batching=make_config().batching.under(catalog.engine(DEFAULT_ENGINE)),
                    multi_token=multi)
    at = {}
    for i, (context, tokens) in enumerate(jobs):
        req = Request(i, context, tokens, (), 512, 0.0, "decode")
        job = Job(req, on_finished=lambda job: at.__setitem__(job.req.idx, (env.now, job.req.tokens_out)),
                  on_failed=None)
        inst.submit(job, prefill=0, decode=tokens, context=context)
    env.run()
    assert inst.kv_in_use == 0
    return at


def test_acceptance_zero_is_plain_decode_plus_the_verify_and_draft_cost(make_config):
    """k=2 proposals all rejected: one token an iteration, as plain decode, each iteration computing
    3 query tokens instead of 1 and proposing 2 tokens at 0.1 of a one-token iteration each."""
    plain = decode_alone(make_config, [(100, 10)])
    spec = decode_alone(make_config, [(100, 10)], {"k": 2, "acceptance": [0.0, 0.0], "draft_cost": 0.1})
    assert plain[0] == (pytest.approx(sum(t(1, 100 + i) for i in range(10))), 10)
    extra = sum(t(3, 100 + i) - t(1, 100 + i) + 2 * 0.1 * t(1, 100 + i) for i in range(10))
    assert spec[0] == (pytest.approx(plain[0][0] + extra), 10)


def test_acceptance_one_makes_k_plus_one_tokens_an_iteration_and_stops_at_the_output(make_config):
    """k=2, every proposal accepted: 3 tokens an iteration, the KV growing by 3; 10 tokens take 4
    iterations, the last keeping 1 (nothing past the output)."""
    at = decode_alone(make_config, [(100, 10)], {"k": 2, "acceptance": [1.0, 1.0]})
    assert at[0] == (pytest.approx(sum(t(3, 100 + 3 * i) for i in range(4))), 10)


def test_a_batch_grows_by_what_each_member_accepts(make_config):
    """Two decoders, every proposal accepted (k=2): A makes 10 tokens in 4 iterations, B 4 in 2
    (3 then 1); the batch reads 200, 206 KV tokens, then A alone 106, 109."""
    at = decode_alone(make_config, [(100, 10), (100, 4)], {"k": 2, "acceptance": [1.0, 1.0]})
    both = t(6, 200) + t(6, 206)
    assert at[1] == (pytest.approx(both), 4)
    assert at[0] == (pytest.approx(both + t(3, 106) + t(3, 109)), 10)


def test_acceptance_is_drawn_per_position_given_the_positions_before():
    """Mean tokens per iteration: 1 + p1 + p1 p2 + p1 p2 p3 (a proposal counts only after all
    before it were accepted)."""
    p = [0.8, 0.5, 0.9]
    multi = MultiToken(SpecDecode(k=3, acceptance=p), _Linear(), np.random.default_rng(1))
    tokens = 200_000
    iterations = multi.join(object(), 0, tokens)
    assert tokens / iterations == pytest.approx(1 + 0.8 + 0.4 + 0.36, rel=0.01)


SPEC = {"k": 2, "acceptance": [0.7, 0.5], "draft_cost": 0.02}
PDD_ROLES = (("prefill", 1), ("relay", 1), ("decode", 1))


def _systems(make_config):
    """PD, PDD with each handoff, and colocated short of KV memory (decoders preempted)."""
    perf = {"spec_decode": SPEC}
    wan = {"bandwidth_gbps": 10, "rtt_ms": 20}
    yield "pd", make_config(roofline=True, perf=perf)
    for handoff in ("one_shot", "catch_up"):
        yield f"pdd_{handoff}", make_config(
            roles=PDD_ROLES, two_clusters=True, wan=wan, roofline=True, perf=perf,
            pdd={"handoff": handoff, "path_policy": "always_relay", "catch_up_tokens": 8})
    yield "colocated_preempting", make_config(roles=(("colocated", 1),), roofline=True, perf=perf,
                                              batching={"memory_utilization": utilization_for(24000)})


def test_every_request_ends_once_with_exactly_its_tokens(make_config):
    """Conservation under MTP in every pipeline, with the run's invariants checked after every
    event: each request ends once, completed, having emitted exactly its output tokens."""
    w = poisson_workload(60, 8.0, 3000, 150, seed=3)
    for name, cfg in _systems(make_config):
        res = simulate(cfg, w, seed=0, check_invariants=True)
        df = res.requests
        assert len(df) == 60 and (df.status == "completed").all(), name
        assert (df.tokens_out == df.output_tokens).all(), name
        if name.startswith("pdd"):                   # the MD took streams over from the RLD
            assert (df.pipeline == "p_rld_md").any() and df.handoffs.sum() > 0
    assert res.instances.preemptions.sum() > 0       # the colocated case did preempt


def test_coalesced_runs_are_exact_under_mtp(make_config):
    """A run of iterations priced at once gives what one iteration at a time gives: the same
    tokens at the same times (but for the rounding of summing iteration times in another order)."""
    w = poisson_workload(60, 8.0, 3000, 150, seed=4)
    for name, cfg in _systems(make_config):
        one_by_one = cfg.model_copy(update={"batching": cfg.batching.model_copy(
            update={"coalesce_decode": False})})
        a, b = simulate(cfg, w, seed=0).requests, simulate(one_by_one, w, seed=0).requests
        assert (a.tokens_out == b.tokens_out).all() and (a.handoffs == b.handoffs).all(), name
        pd.testing.assert_frame_equal(a, b, rtol=1e-9, obj=name)


def test_same_seed_same_result_and_its_own_stream(make_config):
    """Same seed, same result; another seed draws other acceptances; and the acceptance stream is
    its own: the front end's random delays are those of a run without MTP (its intake's cost per
    live stream, which faster decoding lowers, left out)."""
    w = poisson_workload(60, 4.0, 3000, 150, seed=5)
    cfg = make_config(roofline=True, perf={"engine": "sglang", "frontend_stream_us": 0,
                                           "spec_decode": SPEC})
    plain = make_config(roofline=True, perf={"engine": "sglang", "frontend_stream_us": 0})
    a, b, c = (simulate(cfg, w, seed=s).requests for s in (0, 0, 1))
    assert a.equals(b)
    assert not a.tpot_s.equals(c.tpot_s)
    off = simulate(plain, w, seed=0).requests
    assert a.stage_frontend_s.equals(off.stage_frontend_s)
    assert a.tpot_s.mean() < 0.8 * off.tpot_s.mean()


@pytest.mark.parametrize("spec, says", [
    ({"k": 2, "acceptance": [0.8]}, "one rate per proposed position"),
    ({"k": 1, "acceptance": [1.2]}, "acceptance"),
])
def test_bad_spec_decode_is_one_line(make_config, tmp_path, capsys, input_error, spec, says):
    raw = make_config(roofline=True).model_dump(exclude={"base_dir"})
    raw["perf"]["spec_decode"] = spec
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    code = main(["validate", str(path)])
    input_error(code, capsys.readouterr().err, "perf.spec_decode", says)


def test_a_measured_table_cannot_price_verify_steps(make_config):
    with pytest.raises(Exception, match="spec_decode needs kind 'roofline'"):
        make_config(perf__spec_decode={"k": 1, "acceptance": [0.9]})


def _relayed(make_config, spec, handoff, catch_up_tokens=16):
    """One 8k-token request through PDD, always relayed: the RLD streams while its KV crosses
    a 10 Gbps WAN (~2.1 s), then the MD extends the relayed tokens and streams the rest."""
    cfg = make_config(roles=PDD_ROLES, two_clusters=True, wan={"bandwidth_gbps": 10, "rtt_ms": 20},
                      roofline=True, perf={"spec_decode": spec},
                      pdd={"handoff": handoff, "path_policy": "always_relay",
                           "catch_up_tokens": catch_up_tokens})
    one = Workload([TraceRequest(arrival_s=0.0, input_tokens=8192, output_tokens=4000)])
    r = simulate(cfg, one, check_invariants=True).requests.iloc[0]
    assert r.tokens_out == r.output_tokens
    return r


def test_the_rld_relays_what_it_accepted_and_the_md_extends_it_in_one_step(make_config):
    """Every proposal accepted (k=1): the RLD makes two tokens an iteration while the WAN copy
    runs, so about twice the tokens of plain decode reach the user from it, and one-shot hands
    all of them to the MD to recompute in its extend step."""
    plain = _relayed(make_config, {"k": 1, "acceptance": [0.0]}, "one_shot")
    both = _relayed(make_config, {"k": 1, "acceptance": [1.0]}, "one_shot")
    assert both.pipeline == plain.pipeline == "p_rld_md"
    assert both.relay_tokens == pytest.approx(2 * plain.relay_tokens, rel=0.05)
    assert both.handoff_tail_tokens == both.relay_tokens and both.handoffs == 1


def test_catch_up_leaves_at_most_its_threshold_when_an_iteration_makes_several_tokens(make_config):
    """The final handoff leaves at the next boundary, which brings up to k+1 = 4 tokens: the RLD
    decides on that many, so the tail the MD recomputes stays within `catch_up_tokens`. Here a
    round's backlog is 8 tokens: under a threshold of 11 catch-up never gets close enough (8 + 4
    > 11) and the RLD finishes the request; under 16 the tail is 12."""
    spec = {"k": 3, "acceptance": [1.0, 1.0, 1.0]}
    never = _relayed(make_config, spec, "catch_up", catch_up_tokens=11)
    assert never.pipeline == "p_rld" and never.relay_tokens == 4000
    r = _relayed(make_config, spec, "catch_up", catch_up_tokens=16)
    assert r.pipeline == "p_rld_md" and r.handoffs > 1
    assert 1 <= r.handoff_tail_tokens <= 16


DEEPSEEK_UNIT = {   # DeepSeek-V3's decode unit as its report describes it: TP4 x DP80 attention, EP320
    "name": "deepseek_v3_decode", "model": "deepseek-v3",
    "clusters": {"a": {"gpu": "h800", "instances": [
        {"role": "colocated", "count": 1, "tp": 4, "dp": 80, "ep": 320}]}},
    "slo": {"ttft_s": 5.0, "tpot_s": 0.1},
    "batching": {"max_batch": 100_000, "token_budget": 100_000},
    "workload": {"synthetic": {"kind": "benchmark", "knobs": {
        "concurrency": 1024, "isl": 1000, "osl": 1000, "requests": 1024, "warmup": 1024}}},
}


@pytest.mark.parametrize("acceptance", [0.85, 0.90])
def test_deepseek_v3_mtp_speed_up_as_reported(acceptance):
    """Predicted, not fitted: one MTP module (k=1) at the second-token acceptance DeepSeek-V3's
    report measured (85-90%) decodes ~1.8x the tokens per second of plain decode."""
    tps = []
    for spec in (None, {"k": 1, "acceptance": [acceptance], "draft_cost": 0.02}):
        raw = dict(DEEPSEEK_UNIT, perf={"engine": "sglang", "spec_decode": spec})
        cfg = from_dict(raw, "deepseek")
        tps.append(1 / simulate(cfg, load_workload(cfg), seed=0).summary["tpot_mean_s"])
    assert 1.7 < tps[1] / tps[0] < 1.9


def test_a_decoder_lost_mid_run_loses_its_draws_and_every_token_still_arrives(make_config):
    """A decoder crashes while its batch decodes under MTP: its draws go with it, the requests
    are sent again, and each ends once with exactly its tokens (invariants checked)."""
    cfg = make_config(roofline=True, perf={"spec_decode": SPEC})
    w = poisson_workload(40, 8.0, 2000, 300, seed=6)
    t = float(simulate(cfg, w, seed=0).requests.finish_s.median())
    down = {"events": [{"kind": "instance_down", "instance": "a/decode0", "start_s": t,
                        "duration_s": 2.0}]}
    out = simulate(from_dict(dict(cfg.model_dump(exclude={"base_dir"}), faults=down), "faults"), w,
                   seed=0, check_invariants=True)
    df = out.requests
    assert (df.status == "completed").all() and (df.tokens_out == df.output_tokens).all()
    assert out.summary["requests_retried"] > 0


@pytest.mark.parametrize("model", ["llama-3.1-70b", "deepseek-v3", "glm-5"])
@pytest.mark.parametrize("engine", ["sglang", "vllm", "trtllm"])
def test_a_verify_of_one_token_is_the_plain_decode_iteration(model, engine):
    """The verify pass priced through the vectorised roofline at one query token per request is
    the closed-form decode run's iteration, with every term (MoE experts, a sparse cap, a launch
    floor past the captured graphs)."""
    p = Roofline(catalog.model(model), catalog.gpu("h200"), 8, catalog.engine(engine))
    for n in (1, 64, 600):
        ctx = n * 3000.0
        verify = p.iterations(n, ctx, ctx, ctx, n, n)
        assert float(verify) == pytest.approx(p.decode_run(n, int(ctx), 1).first_s, rel=1e-12)
