"""Whole-system invariants and baseline comparisons."""
import numpy as np
import pytest

from pddsim.config import bundled, load_config
from pddsim.metrics import Recorder
from pddsim.sim import load_workload, simulate
from pddsim.workload.model import TraceRequest, Workload
from pddsim.workload.synthetic import poisson_workload

KV = 327_680   # llama-3.1-70b KV bytes per token


def sessions_workload(n_sessions=20, turns=6, seed=0) -> Workload:
    """Closed-loop sessions whose turns extend their context (follows / think_s)."""
    rng = np.random.default_rng(seed)
    reqs, next_id = [], 1000
    for s in range(n_sessions):
        chain, prev = [0, 1], -1
        for t in range(turns):
            add = int(rng.integers(2, 6))
            chain = chain + list(range(next_id, next_id + add))
            next_id += add
            reqs.append(TraceRequest(arrival_s=0.0 if t == 0 else 5.0 * t, input_tokens=64 * len(chain),
                                     output_tokens=int(rng.integers(5, 40)), hash_ids=tuple(chain),
                                     block_tokens=64, session_id=s, think_s=1.0, follows=prev))
            prev = len(reqs) - 1
    # sessions start 0.3 s apart: sort by open-loop time, remapping follows
    times = [0.3 * r.session_id + r.arrival_s for r in reqs]
    order = sorted(range(len(reqs)), key=lambda i: times[i])
    new = {old: i for i, old in enumerate(order)}
    out = []
    for old in order:
        r = reqs[old]
        out.append(TraceRequest(r.arrival_s, r.input_tokens, r.output_tokens, r.hash_ids, 64,
                                r.session_id, r.think_s, -1 if r.follows < 0 else new[r.follows]))
    return Workload(out, sessions=n_sessions)


@pytest.mark.parametrize("replay", ["open", "closed"])
def test_every_request_ends_exactly_once(make_config, replay):
    cfg = make_config(roles=(("prefill", 2), ("decode", 2)),
                 workload={"trace": "x", "replay": replay, "session_start": "poisson",
                           "session_rate_rps": 2.0})
    w = sessions_workload()
    df = simulate(cfg, w).requests
    assert not df.finish_s.is_monotonic_increasing      # requests end out of index order, yet
    assert list(df.request) == list(range(len(w)))      # each row sits at its request's index
    assert list(df.input_tokens) == [r.input_tokens for r in w.requests]
    assert (df.status == "completed").all()
    assert (df.tokens_out == df.output_tokens).all()
    assert (df.finish_s >= df.arrival_s).all()


def test_records_do_not_depend_on_when_the_row_buffer_is_flushed(make_config):
    """Rows are buffered and split into columns in batches: batches of 7 rows (with a partial
    last one) give the frame one batch gives, the run's own."""
    cfg = make_config(roles=(("prefill", 2), ("decode", 2)),
                      workload={"trace": "x", "replay": "closed", "session_start": "poisson",
                                "session_rate_rps": 2.0})
    w = sessions_workload()
    ended = []
    whole = simulate(cfg, w, stop_when=lambda req: ended.append(req) or False).requests
    frames = []
    for flush_rows in (7, len(w)):
        recorder = Recorder(flush_rows)
        for req in ended:
            recorder.record(req)
        frames.append(recorder.frame(cfg.slo, w.requests))
    assert len(w) % 7 and len(ended) == len(w)
    assert frames[0].equals(whole) and frames[1].equals(whole)


def test_a_prompt_the_decode_cache_holds_whole_still_reaches_decode(make_config):
    # nothing to ship: the KV "lands" before the transfer call returns
    cfg = make_config(roles=(("prefill", 1), ("decode", 1)),
                      prefix_cache={"decode_tokens": 4096})
    w = Workload([TraceRequest(arrival_s=t, input_tokens=64, output_tokens=3, hash_ids=(0,),
                               block_tokens=64) for t in (0.0, 1.0)])
    df = simulate(cfg, w).requests
    assert (df.status == "completed").all()
    assert df.hit_tokens_decode.tolist() == [0, 64]


def test_same_seed_same_summary(make_config):
    cfg = make_config(roles=(("prefill", 2), ("decode", 2)), two_clusters=True,
                 wan={"bandwidth_gbps": 10, "rtt_ms": 20,
                      "background": {"mean": 0.3, "std": 0.2, "period_s": 0.5}})
    w = poisson_workload(400, 20, 2000, 50, shared_prefix_tokens=512, seed=3)
    a, b = simulate(cfg, w, seed=5), simulate(cfg, w, seed=5)
    assert a.summary == b.summary
    assert a.requests.equals(b.requests)
    c = simulate(cfg, w, seed=6)     # another seed moves the WAN's background load
    assert c.summary != a.summary


def test_prefix_hit_rate_matches_hand_count(make_config, make_workload):
    cfg = make_config(roles=(("prefill", 1), ("decode", 1)))
    w = make_workload((0.0, 48, 2, [1, 2, 3], 16),      # cold: 0
                 (1.0, 48, 2, [1, 2, 4], 16),      # blocks 1,2 cached: 32
                 (2.0, 64, 2, [1, 2, 4, 5], 16),   # 1,2,4 cached: 48
                 (3.0, 48, 2, [1, 2, 3], 16))      # whole prompt cached, last token recomputed: 32
    res = simulate(cfg, w)
    assert list(res.requests.hit_tokens) == [0, 32, 48, 32]
    assert res.summary["prefix_hit_rate"] == pytest.approx(112 / 208)


def test_cross_dc_pays_the_wan_and_moves_the_uncached_kv(make_config):
    w = poisson_workload(200, 4, 4000, 30, shared_prefix_tokens=1024, seed=1)
    same = simulate(make_config(roles=(("prefill", 1), ("decode", 1))), w)
    cross = simulate(make_config(roles=(("prefill", 1), ("decode", 1)), two_clusters=True,
                            wan={"bandwidth_gbps": 10, "rtt_ms": 30}), w)
    assert cross.summary["ttft_p50_s"] > same.summary["ttft_p50_s"] + 0.5
    assert same.summary["wan_bytes"] == 0
    # no decode-side cache: the decode instance lacks every prompt token
    lacking = cross.requests.input_tokens.sum() * KV
    assert cross.summary["wan_bytes"] == pytest.approx(lacking)
    assert cross.links["wan"]["bytes"] == pytest.approx(cross.summary["wan_bytes"])
    assert same.links["rdma:a"]["bytes"] == pytest.approx(same.summary["rdma_bytes"])


def test_decode_side_cache_sends_only_what_the_decoder_lacks(make_config, make_workload):
    w = make_workload((0.0, 64, 2, [1, 2, 3, 4], 16), (1.0, 96, 2, [1, 2, 3, 4, 5, 6], 16))
    cfg = make_config(roles=(("prefill", 1), ("decode", 1)), two_clusters=True,
                 prefix_cache={"decode_tokens": None})
    df = simulate(cfg, w).requests
    assert list(df.wan_bytes) == [64 * KV, 32 * KV]
    assert list(df.wan_bytes_no_drc) == [64 * KV, 96 * KV]
    assert list(df.hit_tokens_decode) == [0, 64]


def test_closed_loop_issue_times_follow_finish_plus_think(make_config):
    cfg = make_config(roles=(("colocated", 1),), workload={"trace": "x", "replay": "closed"})
    w = Workload([TraceRequest(0.0, 100, 3, session_id=0),
                  TraceRequest(9.0, 200, 2, session_id=0, think_s=2.5, follows=0),
                  TraceRequest(0.5, 100, 2, session_id=1)], sessions=2)
    df = simulate(cfg, w).requests.set_index("request")
    assert df.loc[1, "arrival_s"] == pytest.approx(df.loc[0, "finish_s"] + 2.5)
    assert df.loc[2, "arrival_s"] == pytest.approx(0.5)


def test_sub_agent_branch_replays_beside_its_parent(make_config):
    """Request 1 (a sub-agent) and request 2 (the parent's next turn) both follow request 0: in
    closed loop both leave after it finishes, each after its own think time, and run at once."""
    cfg = make_config(roles=(("colocated", 2),), workload={"trace": "x", "replay": "closed"})
    w = Workload([TraceRequest(0.0, 200, 5, session_id=0),
                  TraceRequest(1.0, 300, 300, session_id=0, think_s=0.5, follows=0),
                  TraceRequest(2.0, 100, 5, session_id=0, think_s=1.5, follows=0),
                  TraceRequest(3.0, 100, 5, session_id=0, think_s=0.2, follows=1)], sessions=1)
    df = simulate(cfg, w).requests.set_index("request")
    end0 = df.loc[0, "finish_s"]
    assert df.loc[1, "arrival_s"] == pytest.approx(end0 + 0.5)
    assert df.loc[2, "arrival_s"] == pytest.approx(end0 + 1.5)
    assert df.loc[2, "arrival_s"] < df.loc[1, "finish_s"]          # concurrent with the sub-agent
    assert df.loc[3, "arrival_s"] == pytest.approx(df.loc[1, "finish_s"] + 0.2)


@pytest.mark.parametrize("replay", ["open", "closed"])
def test_poisson_session_starts_honour_the_time_scale(make_config, replay):
    """The time scale multiplies the Poisson session start rate: the same draws, starts twice as
    early. Open loop also halves each session's offsets; closed loop keeps the think times."""
    w = sessions_workload()
    frames = {}
    for scale in (1.0, 2.0):
        cfg = make_config(roles=(("prefill", 2), ("decode", 2)),
                     workload={"trace": "x", "replay": replay, "session_start": "poisson",
                               "session_rate_rps": 1.0, "time_scale": scale})
        frames[scale] = simulate(cfg, w).requests.set_index("request")
    roots = [i for i, r in enumerate(w.requests) if r.follows < 0]
    np.testing.assert_allclose(frames[2.0].loc[roots, "arrival_s"],
                               frames[1.0].loc[roots, "arrival_s"] / 2)
    turns = [i for i, r in enumerate(w.requests) if r.follows >= 0]
    df = frames[2.0]
    if replay == "closed":
        parents = [w.requests[i].follows for i in turns]
        np.testing.assert_allclose(df.loc[turns, "arrival_s"].to_numpy(),
                                   df.loc[parents, "finish_s"].to_numpy() + 1.0)   # think_s
    else:
        np.testing.assert_allclose(df.loc[turns, "arrival_s"], frames[1.0].loc[turns, "arrival_s"] / 2)


def test_turns_out_of_order_counts_turns_issued_before_their_predecessor_ended(make_config):
    """Request 1 follows request 0 (3 s of decode) but the trace puts it at 1 s: open loop issues
    it early, closed loop after request 0 ends. Request 2 follows request 1 and is on time."""
    w = Workload([TraceRequest(0.0, 100, 300, session_id=0),
                  TraceRequest(1.0, 100, 2, session_id=0, follows=0),
                  TraceRequest(50.0, 100, 2, session_id=0, follows=1),
                  TraceRequest(0.5, 100, 2)], sessions=1)
    shares = {}
    for replay in ("open", "closed"):
        cfg = make_config(roles=(("colocated", 1),), workload={"trace": "x", "replay": replay})
        shares[replay] = simulate(cfg, w).summary["turns_out_of_order"]
    assert shares == {"open": 0.5, "closed": 0.0}
    flat = simulate(make_config(roles=(("colocated", 1),)), poisson_workload(5, 1, 100, 5, seed=0))
    assert flat.summary["turns_out_of_order"] is None        # no request follows another


def test_achieved_rate_is_measured_from_the_issue_times(make_config):
    """Open loop issues on the trace's schedule: 4 requests over 2 s are 3 gaps in 2 s. Closed loop
    issues a turn a think time (1 s) after the one it follows ends, whatever the schedule (0, 5,
    10 s): 3 turns are 2 gaps over the first two turns' ends plus their think times."""
    times = (0.0, 0.5, 1.0, 2.0)
    w = Workload([TraceRequest(t, 100, 2) for t in times])
    assert simulate(make_config(roles=(("colocated", 1),)), w).summary["achieved_rps"] == \
        pytest.approx(1.5)
    turns = Workload([TraceRequest(5.0 * t, 100, 4, session_id=0, think_s=1.0, follows=t - 1)
                      for t in range(3)], sessions=1)
    cfg = make_config(roles=(("colocated", 1),), workload={"trace": "x", "replay": "closed"})
    res = simulate(cfg, turns)
    ends = res.requests.sort_values("request").finish_s.to_numpy()
    issued = res.requests.sort_values("request").arrival_s.to_numpy()
    assert issued[1] == pytest.approx(ends[0] + 1.0) and issued[2] == pytest.approx(ends[1] + 1.0)
    assert issued[0] == 0.0 and res.summary["achieved_rps"] == pytest.approx(2 / (ends[1] + 1.0))


@pytest.mark.parametrize("scenario", ["same_dc_pd.yaml", "pdd.yaml"])
def test_coalescing_decode_iterations_changes_no_result(scenario):
    # Advancing identical decode iterations in one step is an optimisation: the bundled scenarios
    # (their first 200 requests) must give the same summary when every iteration is its own step.
    summaries = []
    for coalesce in ("true", "false"):
        cfg = load_config(bundled(scenario), ["workload.limit=200", f"batching.coalesce_decode={coalesce}"])
        summaries.append(simulate(cfg, load_workload(cfg), 0).summary)
    fast, stepped = summaries
    assert fast.keys() == stepped.keys()
    for key, value in fast.items():
        if isinstance(value, str) or value is None:
            assert stepped[key] == value, key
        else:
            assert stepped[key] == pytest.approx(value, rel=1e-6, nan_ok=True), key


def test_doubling_the_cluster_and_its_load_leaves_ttft_unchanged(make_config):
    """Each instance's NICs carry its own KV: twice the instances at twice the arrival rate see
    the same per-NIC load (~40% here), so TTFT does not grow (a cluster-wide shared link would be
    at 80% and then 160%). The bigger pool routes a little better, so TTFT may drop slightly."""
    def ttft_p50(k):
        cfg = make_config(roles=(("prefill", 2 * k), ("decode", 2 * k)),
                          clusters__a__rdma={"bandwidth_gbps": 40})
        w = poisson_workload(400 * k, 4.0 * k, 3000, 60, input_sigma=0.3, seed=k)
        return simulate(cfg, w).summary["ttft_p50_s"]

    small, big = ttft_p50(1), ttft_p50(2)
    assert 0.8 * small <= big <= 1.05 * small


def test_decoders_count_the_kv_on_its_way_to_them(make_config, make_workload):
    """Two prefills ending together: the second KV goes to the other decoder, not to the one the
    first is still travelling to (both would share its NICs)."""
    cfg = make_config(roles=(("prefill", 2), ("decode", 2)), clusters__a__rdma={"bandwidth_gbps": 8})
    res = simulate(cfg, make_workload((0.0, 4000, 3), (0.0, 4000, 3)))
    kv_s = 4000 * KV / 1e9        # 4000 tokens at 1 GB/s, alone on a pair of NICs
    assert res.requests.ttft_s.max() == pytest.approx(0.01 + 4000 * 1e-5 + kv_s, rel=0.02)
