"""PDD's mechanisms: dual path, relay decode, extend-decode handoff, DRC, path policies."""
import pytest

from pddsim.sim import simulate
from pddsim.workload.synthetic import poisson_workload

KV = 327_680
PDD_ROLES = (("prefill", 1), ("relay", 1), ("decode", 1))


def pdd(make_config, wan_gbps=10, **pdd_cfg):
    return make_config(roles=PDD_ROLES, two_clusters=True,
                  wan={"bandwidth_gbps": wan_gbps, "rtt_ms": 20},
                  prefix_cache={"decode_tokens": None}, policies={"decode_router": "cache_affinity"},
                  pdd=pdd_cfg)


def test_relay_streams_first_then_hands_off_without_gap_or_duplicate(make_config, make_workload):
    # 8k tokens of llama KV = 2.7 GB: ~2.1 s over 10 Gbps, the RLD streams meanwhile
    cfg = pdd(make_config, handoff="one_shot", path_policy="always_relay")
    res = simulate(cfg, make_workload((0.0, 8192, 400)))
    r = res.requests.iloc[0]
    assert r.pipeline == "p_rld_md"
    assert r.tokens_out == r.output_tokens == 400
    assert r.ttft_s < 0.2                         # set by the RLD, not by the WAN
    assert r.handoffs == 1
    assert 0 < r.relay_tokens < 400
    wan = 8192 * KV / (10e9 / 8)
    assert r.relay_tokens == pytest.approx(wan / 0.01, rel=0.1)   # ~one token per 10 ms iteration
    assert r.handoff_stall_s >= 0.01              # one-way latency + the extend step
    assert r.itl_max_s == pytest.approx(r.handoff_stall_s)
    assert res.summary["rld_token_share"] == pytest.approx(r.relay_tokens / 400)


def test_catch_up_ends_with_the_gap_at_or_under_the_threshold(make_config, make_workload):
    cfg = pdd(make_config, handoff="catch_up", path_policy="always_relay", catch_up_tokens=16)
    r = simulate(cfg, make_workload((0.0, 8192, 600))).requests.iloc[0]
    assert r.handoffs > 1
    assert 1 <= r.handoff_tail_tokens <= 16
    assert r.tokens_out == 600
    one_shot = simulate(pdd(make_config, handoff="one_shot", path_policy="always_relay"),
                        make_workload((0.0, 8192, 600))).requests.iloc[0]
    assert r.handoff_stall_s < one_shot.handoff_stall_s      # small stalls instead of one big one
    assert r.relay_tokens > one_shot.relay_tokens            # the RLD works longer


def test_short_output_finishes_on_the_relay_and_cancels_the_wan(make_config, make_workload):
    cfg = pdd(make_config, path_policy="always_relay")
    res = simulate(cfg, make_workload((0.0, 8192, 20)))
    r = res.requests.iloc[0]
    assert r.pipeline == "p_rld" and r.tokens_out == 20 and r.handoffs == 0
    assert 0 < r.wan_bytes < 8192 * KV                      # cancelled part-way
    assert res.links["wan"]["bytes"] == pytest.approx(r.wan_bytes)
    # nothing was cached on the MD: without a DRC the line would have carried the same bytes
    assert r.wan_bytes_no_drc == pytest.approx(r.wan_bytes)


def test_predictive_filter_never_starts_the_wan(make_config, make_workload):
    cfg = pdd(make_config, anomaly_filter={"min_input_tokens": 4096, "max_output_tokens": 32})
    r = simulate(cfg, make_workload((0.0, 8192, 20))).requests.iloc[0]
    assert r.pipeline == "p_rld" and r.wan_bytes == 0


def test_high_hit_request_goes_straight_to_the_md(make_config, make_workload):
    chain = list(range(1, 129))                         # 128 blocks of 64 tokens
    w = make_workload((0.0, 8192, 400, chain, 64), (10.0, 8256, 400, chain + [999], 64))
    df = simulate(pdd(make_config), w).requests
    assert list(df.pipeline) == ["p_rld_md", "p_md"]   # cold first turn relayed, second not
    assert df.hit_tokens_decode.iloc[1] == 8192
    assert df.wan_bytes.iloc[1] == pytest.approx(64 * KV)   # DRC: only the new block crosses


def test_drc_never_sends_a_block_the_md_holds(make_config):
    w = poisson_workload(150, 3, 6000, 40, shared_prefix_tokens=4096, block_tokens=64, seed=2)
    res = simulate(pdd(make_config, path_policy="never_relay"), w)
    df = res.requests
    assert (df.wan_bytes == (df.input_tokens - df.hit_tokens_decode) * KV).all()
    later = df[df.arrival_s > df.finish_s.iloc[0]]           # once the first KV has landed
    assert later.hit_tokens_decode.min() >= 4096             # the shared prefix is never resent
    assert res.summary["wan_bytes"] < res.summary["wan_bytes_no_drc"]


def test_finishing_on_the_relay_overloads_it(make_config):
    """A small RLD (4 GPUs) masks latency for 8k-token prompts easily, but decoding 1,500 tokens
    of each to the end fills its memory: preemptions, queueing, TTFT blows up (PDD.md 3.5)."""
    def run(policy):
        cfg = make_config(roles=(("prefill", 3), ("relay", 1, 4), ("decode", 2)),
                     two_clusters=True, roofline=True, wan={"bandwidth_gbps": 100, "rtt_ms": 20},
                     pdd={"relay_above_s": 0.1, "path_policy": policy})
        return simulate(cfg, poisson_workload(300, 4, 8000, 1500, seed=4))
    base, ablation = run("wan_threshold"), run("finish_on_relay")
    assert ablation.summary["rld_utilization"] > base.summary["rld_utilization"] + 0.3
    assert ablation.summary["ttft_p90_s"] > 10 * base.summary["ttft_p90_s"]
    assert ablation.instances.preemptions.sum() > 0 == base.instances.preemptions.sum()


@pytest.mark.parametrize("handoff", ["one_shot", "catch_up", "adaptive"])
def test_every_token_arrives_under_load(make_config, handoff):
    w = poisson_workload(400, 8, 6000, 200, shared_prefix_tokens=2048, block_tokens=64, seed=1)
    res = simulate(pdd(make_config, handoff=handoff), w)
    df = res.requests
    assert (df.status == "completed").all()
    assert (df.tokens_out == df.output_tokens).all()
    assert res.links["wan"]["bytes"] == pytest.approx(df.wan_bytes.sum())


def _sessions(n_sessions=12, turns=8):
    """Sessions whose turns extend a ~6k-token context, arriving interleaved."""
    from pddsim.workload.model import TraceRequest, Workload
    reqs, next_id = [], 10_000
    for s in range(n_sessions):
        chain = []
        for t in range(turns):
            chain = chain + list(range(next_id, next_id + (90 if t == 0 else 4)))
            next_id += 90 if t == 0 else 4
            reqs.append(TraceRequest(arrival_s=10.0 * t + 0.1 * s, input_tokens=64 * len(chain),
                                     output_tokens=100, hash_ids=tuple(chain), block_tokens=64,
                                     session_id=s))
    reqs.sort(key=lambda r: r.arrival_s)
    return Workload(reqs, sessions=n_sessions)


def test_unaligned_md_routing_lets_the_md_cache_drift_behind(make_config):
    """Without alignment a session's turns scatter over the MDs: the MD-side hit rate falls behind
    the P side's and more KV crosses the WAN (the drift PDD.md 3.7 reports)."""
    def run(router):
        cfg = make_config(roles=(("prefill", 1), ("relay", 1), ("decode", 4)), two_clusters=True,
                     wan={"bandwidth_gbps": 100, "rtt_ms": 20}, prefix_cache={"decode_tokens": None},
                     policies={"decode_router": router}, pdd={"path_policy": "never_relay"})
        return simulate(cfg, _sessions()).summary
    aligned, drifting = run("cache_affinity"), run("least_loaded")
    assert aligned["prefix_hit_rate_md"] > 0.8
    assert drifting["prefix_hit_rate_md"] < aligned["prefix_hit_rate_md"] - 0.15   # 0.67 vs 0.86
    assert drifting["prefix_hit_rate"] == pytest.approx(aligned["prefix_hit_rate"])
    assert drifting["wan_bytes"] > 1.5 * aligned["wan_bytes"]


def test_drc_switch_off_sends_every_prompt_whole(make_config):
    cfg = make_config(roles=PDD_ROLES, two_clusters=True, prefix_cache={"decode_tokens": 0},
                 pdd={"path_policy": "never_relay"})
    s = simulate(cfg, _sessions()).summary
    assert s["wan_bytes"] == pytest.approx(s["wan_bytes_no_drc"])
    assert s["prefix_hit_rate_md"] == 0


def test_a_catch_up_part_the_md_cannot_hold_never_ends_the_request(make_config, make_workload):
    """An MD of 2 x H100 holds ~8.5k tokens of KV: the prompt lands, but a catch-up part on top of
    it cannot fit. Catch-up stops there and the RLD finishes the request; the other request, issued
    later, is still served (a failing shadow used to end the request in its name and stop the run)."""
    cfg = make_config(roles=(("prefill", 1), ("relay", 1), ("decode", 1, 2)), two_clusters=True,
                 prefix_cache={"decode_tokens": 0},
                 pdd={"handoff": "catch_up", "path_policy": "always_relay", "catch_up_tokens": 16})
    df = simulate(cfg, make_workload((0.0, 8400, 1000), (5.0, 2000, 100))).requests
    assert list(df.request) == [0, 1]
    assert (df.status == "completed").all() and (df.tokens_out == df.output_tokens).all()
    first = df.iloc[0]
    assert first.pipeline == "p_rld" and first.relay_tokens == 1000 and first.handoffs == 0


def test_a_request_ending_twice_stops_the_run(make_config, make_workload):
    from pddsim.engine.request import Request
    from pddsim.errors import InvariantError
    w = make_workload((0.0, 1000, 10), (1.0, 1000, 10))

    def end_again(env, dep, pipeline):
        """Request 0 ends once more at 0.9 s, after it completed."""
        first = w.requests[0]
        again = Request(0, first.input_tokens, first.output_tokens, first.hash_ids,
                        first.block_tokens, 0.0, "decode")
        env.timeout(0.9).callbacks.append(lambda _e: pipeline.on_end(again))
    assert simulate(pdd(make_config), w).requests.finish_s.iloc[0] < 0.9
    with pytest.raises(InvariantError, match="request 0 ended twice"):
        simulate(pdd(make_config), w, on_built=end_again)


def test_a_request_ending_at_its_final_handoff_boundary_ended_on_the_relay(make_config, make_workload):
    """The final handoff leaves at the boundary after it is decided; a request whose last token is
    made there (213 tokens here) never reaches the MD: it is an RLD-only request, not a dual-path
    one with no relay tokens."""
    cfg = pdd(make_config, handoff="one_shot", path_policy="always_relay")
    routes = []
    for out in range(205, 221):
        r = simulate(cfg, make_workload((0.0, 8192, out))).requests.iloc[0]
        assert r.tokens_out == out
        if r.pipeline == "p_rld_md":
            assert r.handoffs == 1 and 0 < r.relay_tokens < out, out
        else:
            assert r.pipeline == "p_rld" and r.relay_tokens == out and r.handoffs == 0, out
        routes.append(r.pipeline)
    # shorter outputs end on the RLD, longer ones are handed over: the boundary lies in the range
    assert routes == sorted(routes, key=["p_rld", "p_rld_md"].index) and len(set(routes)) == 2


def test_a_preemption_on_the_md_is_not_a_handoff_stall(make_config, make_workload):
    """Two handed-over requests outgrow an MD of ~8.5k tokens: the newer one is preempted and
    recomputes. Its handoff stall stays the handoff's; the recompute gap shows in its ITL."""
    cfg = make_config(roles=(("prefill", 1), ("relay", 1), ("decode", 1, 2)), two_clusters=True,
                 prefix_cache={"decode_tokens": 0},
                 pdd={"handoff": "one_shot", "path_policy": "always_relay"})
    res = simulate(cfg, make_workload((0.0, 3000, 3000), (0.1, 3000, 3000)))
    df = res.requests
    assert res.instances.set_index("role").preemptions["decode"] >= 1
    assert (df.tokens_out == 3000).all() and (df.handoffs == 1).all()
    assert df.handoff_stall_s.max() < 0.1                  # WAN latency + one small extend step
    assert df.itl_max_s.max() > 1.0                        # the preempted one waited much longer


def test_a_request_still_queued_at_the_relay_when_its_kv_reaches_the_md_goes_to_the_md(
        make_config, make_workload):
    """A small RLD (2 GPUs, ~8.5k tokens) is full with a long request; the next one waits there.
    Once its KV is on the MD, the MD serves it at once instead of after the RLD frees up."""
    cfg = make_config(roles=(("prefill", 1), ("relay", 1, 2), ("decode", 1)), two_clusters=True,
                 wan={"bandwidth_gbps": 100, "rtt_ms": 20}, prefix_cache={"decode_tokens": 0},
                 pdd={"handoff": "one_shot", "path_policy": "always_relay",
                      "anomaly_filter": {"min_input_tokens": 6000, "max_output_tokens": 5000}})
    df = simulate(cfg, make_workload((0.0, 6000, 2000), (0.1, 4000, 300))).requests
    assert df.pipeline.iloc[0] == "p_rld"                  # holds the RLD for ~20 s
    second = df.iloc[1]
    assert second.pipeline == "p_md" and second.relay_tokens == 0 and second.handoffs == 0
    assert second.tokens_out == 300
    assert second.ttft_s < 1.0                             # not the ~20 s the RLD stays busy


def test_the_filter_catches_long_input_short_output_traffic(make_config, make_workload):
    """A mix with a few long-prompt, few-token requests (PDD.md 3.6): the filter sends those, and
    only those, to finish on the RLD without touching the WAN."""
    ordinary = [(0.5 * i, 6000, 300) for i in range(20)]
    anomalous = [(0.5 * i + 0.25, 12000, 16) for i in range(0, 20, 5)]
    w = make_workload(*sorted(ordinary + anomalous))
    cfg = pdd(make_config, wan_gbps=100,
              anomaly_filter={"min_input_tokens": 8192, "max_output_tokens": 32})
    df = simulate(cfg, w).requests
    caught = df.pipeline == "p_rld"
    assert (caught == (df.input_tokens == 12000)).all()
    assert (df[caught].wan_bytes == 0).all() and (df[caught].wan_bytes_no_drc == 0).all()
    assert (df.status == "completed").all()


def test_a_request_failing_before_its_route_is_decided_has_none(make_config, make_workload):
    """A prompt larger than the P's KV memory (2 x H100: ~8.5k tokens) fails there, before PDD
    picks a route: it is recorded with no route, not with PD's `p_d`, a route PDD does not have."""
    cfg = make_config(roles=(("prefill", 1, 2), ("relay", 1), ("decode", 1)), two_clusters=True)
    res = simulate(cfg, make_workload((0.0, 20_000, 10), (1.0, 2000, 10)))
    df = res.requests
    assert list(df.status) == ["failed", "completed"]
    assert df.failure.iloc[0].endswith("context exceeds the instance's KV memory")
    assert df.pipeline.iloc[0] == "" and df.pipeline.iloc[1] in ("p_md", "p_rld_md", "p_rld")
    assert res.summary["pipeline_p_md"] + res.summary["pipeline_p_rld_md"] + \
        res.summary["pipeline_rld_only"] == pytest.approx(0.5)
