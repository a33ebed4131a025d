"""PDD under faults: the paths a request's work takes when an MD, an RLD or the WAN goes away while
its KV or its catch-up parts are under way, and the work of ended requests that drains (or is let
go) after them. One cold request of 8,192 tokens, 2,000 out, relayed with catch-up handoffs on the
exact linear model (tests/conftest.py): its timings, read off a clean run's timeline, are

* the prompt's KV reaches the RLD at 0.146 s; the WAN delta's last byte leaves at 2.239 s and lands
  at 2.249 s (one-way latency 10 ms);
* the first catch-up part (token IDs) leaves at 2.258 s, lands at 2.268 s; the MD absorbs it;
* the RLD, decoding a token per ~10 ms, would finish the request at ~20 s.

Every run is checked against the engine's invariants (KV never negative nor over the pool, nothing
held by an instance that is down, every instance idle and every flow ended at the end)."""
from __future__ import annotations

import pytest

from pddsim.sim import simulate

PDD_ROLES = (("prefill", 1), ("relay", 1), ("decode", 1))
DELTA_SENT, DELTA_LANDS = 2.2394, 2.2494
IDS_SENT, IDS_LAND = 2.2577, 2.2677


def catch_up(make_config, faults: dict | None = None, rtt_ms=20, rdma_rtt_ms=0.0, **pdd):
    return make_config(roles=PDD_ROLES, two_clusters=True, wan={"bandwidth_gbps": 10, "rtt_ms": rtt_ms},
                       clusters__a__rdma={"bandwidth_gbps": 400, "rtt_ms": rdma_rtt_ms},
                       prefix_cache={"decode_tokens": None},
                       pdd={"handoff": "catch_up", "path_policy": "always_relay",
                            "catch_up_tokens": 16, **pdd},
                       faults=faults, observe={"timeline": True})


def wan_down(start, duration=None):
    return {"kind": "link_down", "link": "wan", "start_s": start, "duration_s": duration}


def down(instance, start, duration=None):
    return {"kind": "instance_down", "instance": instance, "start_s": start, "duration_s": duration}


def transfers(res, what: str) -> list[tuple[float, float]]:
    """(sent, delivered) of every transfer of `what` that was delivered, from the run's timeline."""
    begin, out = {}, []
    for e in res.timeline.events:
        if e.get("cat") == "transfer" and e["name"] == what:
            if e["ph"] == "b":
                begin[e["id"]] = e["ts"] / 1e6
            else:
                out.append((begin[e["id"]], e["ts"] / 1e6))
    return sorted(out)


class Leftovers(list):
    """One entry per piece of ended requests' work (each lets go of what it held before its run
    ends): the rises of the pipeline's count of them, seen after every event of the runs given
    `watch` as their `on_built`."""

    def watch(self, env, dep, pipeline):
        last = [0]

        def count():
            self.extend([1] * max(pipeline.leftovers - last[0], 0))
            last[0] = pipeline.leftovers
        env.checks.append(count)


@pytest.fixture
def leftovers():
    return Leftovers()


def run(cfg, make_workload, *reqs, check=True, on_built=None):
    return simulate(cfg, make_workload(*(reqs or ((0.0, 8192, 2000),))), seed=0,
                    check_invariants=check, on_built=on_built)


def test_the_timings_the_scenarios_rely_on(make_config, make_workload):
    res = run(catch_up(make_config), make_workload)
    r = res.requests.iloc[0]
    assert r.pipeline == "p_rld_md" and r.status == "completed" and r.handoffs == 2
    kv = transfers(res, "prompt KV")
    assert [t for _, t in kv] == pytest.approx([0.1456, DELTA_LANDS], abs=1e-4)
    ids = transfers(res, "token IDs")
    assert ids[0] == pytest.approx((IDS_SENT, IDS_LAND), abs=1e-4)
    alone = run(make_config(roles=PDD_ROLES, two_clusters=True,
                            pdd={"path_policy": "finish_on_relay"}), make_workload)
    assert alone.requests.e2e_s.iloc[0] == pytest.approx(20.1, abs=0.2)   # the RLD alone


# ---- ended requests' catch-up work -------------------------------------------------------------

def test_ids_stalled_for_good_after_the_request_ended_are_let_go_at_the_end(
        make_config, make_workload, leftovers):
    """The WAN drops between the delta and the first catch-up part and never returns: the part's
    IDs stall; the RLD finishes the request; the run ends with the IDs cancelled."""
    res = run(catch_up(make_config, {"events": [wan_down(2.25)]}), make_workload,
              on_built=leftovers.watch)
    r = res.requests.iloc[0]
    assert r.status == "completed" and r.pipeline == "p_rld" and r.relay_tokens == 2000
    assert r.handoffs == 0 and r.tokens_out == 2000
    assert leftovers == [1]
    assert res.links["wan"]["flows"] == 2 and transfers(res, "token IDs") == []


def test_ids_landing_after_the_request_ended_drain(make_config, make_workload, leftovers):
    """The line returns after the RLD finished: the IDs land for an ended request, the MD does
    nothing with them, and the run waits for them before it ends."""
    res = run(catch_up(make_config, {"events": [wan_down(2.25, 40.0)]}), make_workload,
              on_built=leftovers.watch)
    r = res.requests.iloc[0]
    assert r.status == "completed" and r.pipeline == "p_rld" and r.finish_s < 21
    assert leftovers == [1]
    ids = transfers(res, "token IDs")
    assert len(ids) == 1 and ids[0][1] == pytest.approx(42.25 + 0.01, abs=1e-3)
    assert res.summary["sim_duration_s"] == pytest.approx(ids[0][1])


def test_requests_ending_in_every_phase_of_a_catch_up_part_leave_nothing_behind(
        make_config, make_workload, leftovers):
    """Requests ending around the first catch-up part, on a WAN of 30 ms one way (the delta's last
    bytes and a part's IDs fly for three RLD iterations): as the delta lands, before the part
    leaves, with its IDs in flight, while the MD extends it, after. Each completes once; work in
    flight when its request ends is a leftover that drains: the P frees the prompt's KV as the delta
    lands, the MD what it absorbed (a run used to end with the delta still flying, the P holding
    the prompt's KV)."""
    phases = set()
    for out in range(200, 240):
        before = len(leftovers)
        res = run(catch_up(make_config, rtt_ms=60), make_workload, (0.0, 8192, out),
                  on_built=leftovers.watch)
        r = res.requests.iloc[0]
        assert r.status == "completed" and r.tokens_out == out, out
        assert r.pipeline in ("p_rld", "p_rld_md"), out
        if len(leftovers) > before:
            assert r.pipeline == "p_rld" and r.handoffs == 0, out
            delta_lands = transfers(res, "prompt KV")[-1][1]
            ids = transfers(res, "token IDs")
            phases.add("delta landing" if r.finish_s < delta_lands else
                       "ids in flight" if any(s <= r.finish_s < t for s, t in ids) else "extending")
    assert phases == {"delta landing", "ids in flight", "extending"}


# ---- an MD lost ---------------------------------------------------------------------------------

@pytest.mark.parametrize("when,what", [
    (DELTA_SENT + 0.005, "the delta's last bytes in flight"),
    (DELTA_LANDS + 1e-4, "the handoff decided, the RLD's boundary not reached"),
    (IDS_SENT + 0.005, "the first part's IDs in flight"),
    (IDS_LAND + 0.001, "the MD extending the first part"),
])
def test_an_md_lost_during_catch_up_leaves_the_rld_to_finish(make_config, make_workload, when, what):
    res = run(catch_up(make_config, {"events": [down("b/decode0", when)]}), make_workload)
    r = res.requests.iloc[0]
    assert r.status == "completed", what
    assert r.pipeline == "p_rld" and r.relay_tokens == 2000 and r.handoffs == 0, what
    assert res.summary["retries"] == 0, what
    assert r.e2e_s == pytest.approx(20.1, abs=0.2), what          # nothing waited for the MD


def test_an_md_lost_while_a_stalled_part_waits_cancels_its_ids(make_config, make_workload, leftovers):
    res = run(catch_up(make_config, {"events": [wan_down(2.25), down("b/decode0", 10.0)]}),
              make_workload, on_built=leftovers.watch)
    r = res.requests.iloc[0]
    assert r.status == "completed" and r.pipeline == "p_rld" and r.relay_tokens == 2000
    assert leftovers == []                  # lost with its MD before the request ended


def test_an_md_lost_after_the_request_ended_takes_its_leftover_with_it(
        make_config, make_workload, leftovers):
    res = run(catch_up(make_config, {"events": [wan_down(2.25), down("b/decode0", 25.0)]}),
              make_workload, on_built=leftovers.watch)
    r = res.requests.iloc[0]
    assert r.status == "completed" and r.finish_s < 21
    assert leftovers == [1]
    assert res.summary["sim_duration_s"] == pytest.approx(25.0)   # let go as the MD died


def test_a_delta_stalled_past_the_timeout_leaves_the_rld_to_finish(make_config, make_workload):
    res = run(catch_up(make_config, {"transfer_timeout_s": 3.0, "degraded": "wait",
                                     "events": [wan_down(1.0, 100.0)]}), make_workload)
    r = res.requests.iloc[0]
    assert r.status == "completed" and r.pipeline == "p_rld" and r.relay_tokens == 2000
    assert res.summary["retries"] == 0
    assert 0 < r.wan_bytes < 8192 * 327_680                      # only what left before it stalled


# ---- an RLD lost ----------------------------------------------------------------------------------

def test_an_rld_lost_with_a_part_in_flight_cancels_it_and_the_request_starts_over(
        make_config, make_workload):
    res = run(catch_up(make_config, {"events": [wan_down(2.25, 20.0), down("a/relay0", 10.0, 5.0)]}),
              make_workload)
    r = res.requests.iloc[0]
    assert r.status == "completed" and r.tokens_out == 2000
    assert res.summary["retries"] == 1
    # started over at 10 s with the RLD down: the MD takes it once the line is back at 22.25 s
    assert r.pipeline == "p_md" and r.relay_tokens == 0 and r.ttft_s > 22.25
    assert transfers(res, "token IDs") == []                   # the stalled part was cancelled


# ---- every MD and RLD down ------------------------------------------------------------------------

def test_with_every_md_and_rld_down_a_prefilled_request_starts_over(make_config, make_workload):
    """Prefill takes 0.092 s; both decode pools are down from 0.05 s to 0.2 s: two prefills find no
    path and start over, the third finds the RLD back."""
    res = run(catch_up(make_config, {"events": [down("a/relay0", 0.05, 0.15),
                                                down("b/decode0", 0.05, 0.15)]}), make_workload)
    r = res.requests.iloc[0]
    assert r.status == "completed" and r.tokens_out == 2000
    assert res.summary["retries"] == 2
    assert r.ttft_s > 0.2 + 0.05


def test_with_every_md_and_rld_down_for_good_the_request_fails_after_its_retries(
        make_config, make_workload):
    res = run(catch_up(make_config, {"max_retries": 2, "events": [down("a/relay0", 0.05),
                                                                  down("b/decode0", 0.05)]}),
              make_workload)
    r = res.requests.iloc[0]
    assert r.status == "failed" and r.failure == "instance_failed"
    assert res.summary["retries"] == 2


# ---- an attempt owns its transfers: abandoning it, or leaving a path, lets go of exactly them ------

def test_with_the_rdma_down_for_good_requests_go_to_the_md_and_their_relay_copy_is_cancelled(
        make_config, make_workload):
    """Every prompt's copy to the RLD stalls; each request's delta lands on the MD, which takes it.
    The copy still heading for the RLD is cancelled and the P frees the prompt's KV (it used to
    stay held: the P filled up and later requests failed as stalled)."""
    cfg = catch_up(make_config, {"events": [{"kind": "link_down", "link": "rdma:a", "start_s": 0.0,
                                             "duration_s": None}]}, handoff="one_shot")
    w = make_workload(*[(0.5 * i, 6000, 50) for i in range(12)])
    res = simulate(cfg, w, seed=0, check_invariants=True)
    df = res.requests
    assert (df.status == "completed").all() and (df.pipeline == "p_md").all()
    assert res.links["rdma:a"]["bytes"] == 0


def test_a_relay_copy_landing_after_its_prefill_died_frees_nothing_twice(make_config, make_workload):
    """The P dies as the prompt's last bytes fly to the RLD (1 ms one way): the attempt is lost
    and starts over; the copy's late delivery must not free the dead P's KV again (the P's KV
    went negative)."""
    cfg = catch_up(make_config, rdma_rtt_ms=2)
    base = run(cfg, make_workload)
    sent, lands = transfers(base, "prompt KV")[0]
    assert lands - sent > 0.001
    faulted = catch_up(make_config, {"events": [down("a/prefill0", lands - 0.0005, 1.0)]},
                       rdma_rtt_ms=2)
    res = run(faulted, make_workload)
    r = res.requests.iloc[0]
    assert r.status == "completed" and r.tokens_out == 2000
    assert res.summary["retries"] == 1
