"""Faults in a scenario (`faults:`): link outages and degradations, what they do to transfers and
requests, how a run that cannot progress ends, and PDD's degraded mode. Small deployments with
exact iteration times (tests/conftest.py) so delays can be checked to the second."""
from functools import partial

import numpy as np
import pandas as pd
import pytest
import simpy
from conftest import config, workload
from hypothesis import given, settings
from hypothesis import strategies as st

from pddsim import cli
from pddsim.config import from_dict
from pddsim.engine.network import Fabric, Link
from pddsim.sim import simulate

PDD_ROLES = (("prefill", 1), ("relay", 1), ("decode", 1))
PD_ROLES = (("prefill", 1), ("decode", 1))


def _with_faults(cfg, faults: dict):
    raw = cfg.model_dump()
    raw["faults"] = faults
    return from_dict(raw, "test")


def _poisson(n=40, rate=2.0, seed=1):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    return workload(*[(float(a), int(i), int(o)) for a, i, o in
                      zip(t, rng.integers(200, 4000, n), rng.integers(5, 200, n))])


# ---- the link ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["link", "fabric"])
def test_a_lone_transfer_is_delayed_by_exactly_the_outage(kind):
    env = simpy.Environment()
    if kind == "link":
        carrier = Link(env, "l", 100.0, 0.5)
        send = lambda: carrier.send(1000, lambda: done.append(env.now))   # noqa: E731
    else:
        carrier = Fabric(env, "f", 0.5)
        carrier.attach("a", 100.0)
        carrier.attach("b", 100.0)
        send = lambda: carrier.send("a", "b", 1000, lambda: done.append(env.now))   # noqa: E731
    done: list[float] = []
    send()

    def outage():
        yield env.timeout(3.0)
        carrier.set_scale(0.0)
        yield env.timeout(7.0)
        carrier.set_scale(1.0)

    env.process(outage())
    env.run()
    assert done == [pytest.approx(10.0 + 7.0 + 0.5, rel=1e-12)]
    assert carrier.bytes_carried == pytest.approx(1000)


def test_a_degraded_link_runs_at_its_factor():
    env = simpy.Environment()
    link = Link(env, "l", 100.0, 0.0)
    done = []
    link.send(1000, lambda: done.append(env.now))
    link.set_scale(0.25)
    env.run()
    assert done == [pytest.approx(40.0)]


def _deliveries(kind, flows, scale_at=None, scale=1.0):
    """Delivery times of `flows` [(start_s, nbytes)] on a link or a fabric, the line set to
    `scale` at `scale_at`."""
    env = simpy.Environment()
    if kind == "link":
        net = Link(env, "l", 1.234e9, 0.01, flow_cap_Bps=0.7e9)
        send = net.send
    else:
        net = Fabric(env, "f", 0.01)
        net.attach("a", 1.234e9)
        net.attach("b", 0.97e9)
        send = partial(net.send, "a", "b")
    done = {}
    for i, (t, n) in enumerate(flows):
        env.timeout(t).callbacks.append(
            lambda _, i=i, n=n: send(n, lambda: done.__setitem__(i, env.now)))
    if scale_at is not None:
        env.timeout(scale_at).callbacks.append(lambda _: net.set_scale(scale))
    env.run()
    return [done[i] for i in range(len(flows))]


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["link", "fabric"]), at=st.floats(0, 100),
       flows=st.lists(st.tuples(st.floats(0, 100), st.floats(1e6, 5e9)), min_size=1, max_size=5))
def test_a_factor_1_degradation_moves_no_delivery_by_a_bit(kind, at, flows):
    assert _deliveries(kind, flows, at, 1.0) == _deliveries(kind, flows)


# ---- scenarios --------------------------------------------------------------------------------

def _compare(a, b):
    """Two runs' per-request outcomes agree (to float rounding: a fault that changes nothing
    still reschedules the link's timers)."""
    assert list(a.requests.status) == list(b.requests.status)
    for col in ("ttft_s", "e2e_s", "tokens_out", "wan_bytes"):
        np.testing.assert_allclose(a.requests[col], b.requests[col], rtol=1e-9, atol=1e-9)


def _factor_1_and_not(cfg, event):
    w = _poisson()
    return simulate(cfg, w, seed=1), simulate(_with_faults(cfg, {"events": [event]}), w, seed=1)


def _wan_with_background(tmp_path):
    return config(tmp_path, roles=PDD_ROLES, two_clusters=True,
                  wan={"bandwidth_gbps": 10, "rtt_ms": 20, "background": {"mean": 0.3, "std": 0.1}})


def test_an_outage_of_no_duration_changes_no_result(tmp_path):
    base, faulted = _factor_1_and_not(_wan_with_background(tmp_path), {
        "kind": "link_down", "link": "wan", "start_s": 5.0, "duration_s": 0.0})
    _compare(base, faulted)
    assert faulted.summary["availability_wan"] == 1.0


@pytest.mark.parametrize("link", ["wan", "rdma:a", "rdma:b"])
def test_a_factor_1_degradation_changes_no_result_bit_for_bit(tmp_path, link):
    # a capacity change that leaves every rate as it was is no change: not even a rescheduled timer
    base, faulted = _factor_1_and_not(_wan_with_background(tmp_path), {
        "kind": "link_degrade", "link": link, "factor": 1.0, "start_s": 3.0, "duration_s": 10.0})
    cols = [c for c in base.requests.columns]
    assert faulted.requests[cols].equals(base.requests[cols])
    assert faulted.summary["availability_wan"] == 1.0


def test_a_wan_outage_delays_a_lone_cross_dc_request_by_the_outage(tmp_path):
    cfg = config(tmp_path, roles=PD_ROLES, two_clusters=True)
    w = workload((0.0, 8000, 10))
    base = simulate(cfg, w, seed=0).requests.iloc[0]
    # the prompt's KV (8000 x 320 KB) takes ~2 s over 10 Gbps: the line drops 1 s into it
    start = base.ttft_s - base.ttft_kv_wan_s + 1.0
    out = simulate(_with_faults(cfg, {"events": [
        {"kind": "link_down", "link": "wan", "start_s": start, "duration_s": 30.0}]}), w, seed=0)
    r = out.requests.iloc[0]
    assert r.ttft_s == pytest.approx(base.ttft_s + 30.0, rel=1e-9)
    assert r.ttft_kv_wan_s == pytest.approx(base.ttft_kv_wan_s + 30.0, rel=1e-9)
    assert out.summary["availability_wan"] == pytest.approx(1 - 30.0 / out.summary["sim_duration_s"])


@pytest.mark.parametrize("roles,background", [(PD_ROLES, None), (PDD_ROLES, {"mean": 0.3, "std": 0.1})])
def test_a_line_that_never_comes_back_ends_the_run_with_stalled_requests(tmp_path, roles, background):
    cfg = config(tmp_path, roles=roles, two_clusters=True,
                 wan={"bandwidth_gbps": 10, "rtt_ms": 20, "background": background},
                 pdd={"path_policy": "never_relay"})
    w = _poisson()
    out = simulate(_with_faults(cfg, {"degraded": "wait", "events": [
        {"kind": "link_down", "link": "wan", "start_s": 5.0, "duration_s": None}]}), w, seed=0,
        check_invariants=True)
    df = out.requests
    assert sorted(df.request) == list(range(len(w)))          # every request ended, once
    stalled = df[df.status == "failed"]
    assert len(stalled) > 0 and (stalled.failure == "stalled").all()
    done = df[df.status == "completed"]
    assert (stalled.finish_s > 5.0).all() and (done.arrival_s + done.ttft_s < 5.1).all()
    assert out.summary["failed_stalled"] == len(stalled)
    assert out.summary["requests_failed"] == len(stalled)
    # the string columns, taken from their few values, are what pandas makes of them row by row
    by_row = pd.Series(df.failure.tolist(), index=df.index, name="failure")
    assert df.failure.equals(by_row) and df.failure.dtype == by_row.dtype
    assert df.status.equals(pd.Series(np.where(by_row == "", "completed", "failed"), index=df.index,
                                      name="status"))


def test_pdd_in_degraded_mode_finishes_new_requests_on_the_relay(tmp_path):
    cfg = config(tmp_path, roles=PDD_ROLES, two_clusters=True, pdd={"path_policy": "never_relay"})
    w = _poisson(n=60)
    outage = {"kind": "link_down", "link": "wan", "start_s": 5.0, "duration_s": 10.0}
    relay = simulate(_with_faults(cfg, {"degraded": "finish_on_relay", "events": [outage]}), w,
                     seed=0, check_invariants=True).requests
    wait = simulate(_with_faults(cfg, {"degraded": "wait", "events": [outage]}), w, seed=0,
                    check_invariants=True).requests
    assert (relay.status == "completed").all() and (wait.status == "completed").all()
    during = (relay.arrival_s > 5.5) & (relay.arrival_s < 14.0)
    assert (relay[during].pipeline == "p_rld").all()
    assert (wait[during].pipeline == "p_md").all()
    # waiting for the line costs the requests that arrive during the outage; the RLD serves them now
    assert relay[during].ttft_s.max() < 2.0 < wait[during].ttft_s.min()


@pytest.mark.parametrize("faults,field", [
    ({"events": [{"kind": "link_down", "link": "wan2", "start_s": 0, "duration_s": 1}]},
     "faults.events.0.link: no link 'wan2'"),
    ({"events": [{"kind": "link_down", "link": "wan", "factor": 0.5, "start_s": 0,
                  "duration_s": 1}]}, "faults.events.0.link_down"),
    ({"events": [{"kind": "instance_down", "instance": "a/decode9", "start_s": 0,
                  "duration_s": 1}]}, "faults.events.0"),
    ({"events": [{"kind": "link_down", "link": "wan", "start_s": -1, "duration_s": 1}]},
     "faults.events.0.link_down.start_s"),
    ({"random": [{"role": "colocated", "mtbf_s": 10, "mttr_s": 1}]}, "faults.random"),
    ({"max_retries": -1}, "faults.max_retries"),
])
def test_a_bad_faults_section_is_one_line_naming_the_field(tmp_path, capsys, faults, field):
    import yaml
    raw = config(tmp_path, roles=PDD_ROLES, two_clusters=True).model_dump(exclude={"base_dir"})
    raw["faults"] = faults
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert cli.main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and field in err, err


# ---- instances --------------------------------------------------------------------------------

def _down(instance, start, duration):
    return {"kind": "instance_down", "instance": instance, "start_s": start, "duration_s": duration}


@pytest.mark.parametrize("roles,two,decoder", [(PD_ROLES, False, "a/decode0"),
                                                (PD_ROLES, True, "b/decode0"),
                                                (PDD_ROLES, True, "b/decode0"),
                                                ((("colocated", 1),), False, "a/colocated0")])
def test_a_request_on_a_dying_instance_is_sent_again_and_completes(tmp_path, roles, two, decoder):
    cfg = config(tmp_path, roles=roles, two_clusters=two, pdd={"path_policy": "never_relay"})
    w = workload((0.0, 2000, 400))
    base = simulate(cfg, w, seed=0)
    t = base.requests.finish_s[0] - 1.0                      # it is decoding then
    out = simulate(_with_faults(cfg, {"events": [_down(decoder, t, 5.0)]}), w, seed=0,
                   check_invariants=True)
    r = out.requests.iloc[0]
    assert r.status == "completed" and r.tokens_out == 400
    if roles == PDD_ROLES:                       # started over at once: the RLD finished it
        assert r.pipeline == "p_rld" and r.finish_s > t
    else:                                        # it waited for the restart, then started over
        assert r.finish_s > t + 5.0
    assert out.summary["requests_retried"] == 1 and out.summary["retries"] == 1
    role = decoder.split("/")[1].rstrip("0")
    dur = out.summary["sim_duration_s"]
    assert out.summary[f"availability_{role}"] == pytest.approx(1 - min(5.0, dur - t) / dur)


def test_retries_are_bounded_then_the_request_fails_as_instance_failed(tmp_path):
    cfg = config(tmp_path, roles=PD_ROLES)
    w = workload((0.0, 2000, 400), (0.0, 1000, 10))
    t = simulate(cfg, w, seed=0).requests.finish_s[0] - 1.0
    events = [_down("a/decode0", t + 2 * i, 1.0) for i in range(3)]   # down three times
    for retries, status in ((3, "completed"), (2, "failed")):
        out = simulate(_with_faults(cfg, {"max_retries": retries, "events": events}), w, seed=0,
                       check_invariants=True)
        r = out.requests.iloc[0]
        assert r.status == status
        assert out.summary["retries"] == min(3, retries)
        assert out.summary["failed_instance_failed"] == (status == "failed")
        assert out.requests.iloc[1].status == "completed"


def test_a_restarted_instance_has_lost_its_prefix_cache(tmp_path):
    cfg = config(tmp_path, roles=(("colocated", 1),), prefix_cache={"prefill_tokens": None})
    chain = list(range(40))
    w = workload((0.0, 40 * 64, 5, chain, 64), (20.0, 40 * 64, 5, chain, 64))
    hit = simulate(cfg, w, seed=0).requests.hit_tokens
    assert hit[1] > 0
    out = simulate(_with_faults(cfg, {"events": [_down("a/colocated0", 10.0, 1.0)]}), w, seed=0)
    assert list(out.requests.hit_tokens) == [0, 0]
    assert out.summary["retries"] == 0                       # it held no request when it died


def test_a_stalled_transfer_times_out_and_fails_after_its_retries(tmp_path):
    cfg = config(tmp_path, roles=PD_ROLES, two_clusters=True)
    w = workload((0.0, 8000, 10))
    out = simulate(_with_faults(cfg, {"transfer_timeout_s": 5.0, "max_retries": 2, "events": [
        {"kind": "link_down", "link": "wan", "start_s": 0.5, "duration_s": 1000.0}]}), w, seed=0,
        check_invariants=True)
    r = out.requests.iloc[0]
    assert r.failure == "transfer_timeout" and out.summary["retries"] == 2
    assert out.summary["failed_transfer_timeout"] == 1
    assert r.finish_s < 30.0                      # three attempts of at most 5 s stalled each


@pytest.mark.parametrize("roles,two", [(PD_ROLES, False), (PD_ROLES, True), (PDD_ROLES, True),
                                       ((("colocated", 2),), False)])
def test_under_random_failures_every_request_ends_exactly_once(tmp_path, roles, two):
    cfg = config(tmp_path, roles=tuple((r[0], 2) for r in roles), two_clusters=two)
    random = [{"role": r[0], "mtbf_s": 8.0, "mttr_s": 2.0} for r in roles]
    w = _poisson(n=80, rate=4.0)
    out = simulate(_with_faults(cfg, {"random": random, "transfer_timeout_s": 3.0,
                                      "max_retries": 2}), w, seed=3, check_invariants=True)
    df = out.requests
    assert sorted(df.request) == list(range(len(w)))
    assert out.summary["retries"] > 0
    failed = df[df.status == "failed"]
    assert set(failed.failure) <= {"instance_failed", "transfer_timeout", "stalled"}
    assert sum(out.summary[f"failed_{r}"] for r in ("instance_failed", "transfer_timeout",
                                                   "stalled", "other")) == len(failed)
    again = simulate(_with_faults(cfg, {"random": random, "transfer_timeout_s": 3.0,
                                        "max_retries": 2}), w, seed=3)
    assert again.requests.equals(df)                          # seeded: the same faults


# ---- the study --------------------------------------------------------------------------------

def test_the_faults_command_compares_systems_minute_by_minute(tmp_path, capsys):
    import json

    import yaml
    paths = []
    for name, roles, two, link in (("same_dc", PD_ROLES, False, "rdma:a"),
                                   ("pdd", PDD_ROLES, True, "wan")):
        raw = config(tmp_path, roles=roles, two_clusters=two).model_dump(exclude={"base_dir"})
        raw["name"] = name
        raw["workload"] = {"synthetic": {"kind": "poisson", "knobs": {
            "n_requests": 200, "rate_rps": 1.0, "input_mean": 1000, "output_mean": 50}}}
        raw["faults"] = {"events": [{"kind": "link_down", "link": link, "start_s": 60,
                                     "duration_s": 60}]}
        paths.append(tmp_path / f"{name}.yaml")
        paths[-1].write_text(yaml.safe_dump(raw))
    plot = tmp_path / "f.png"
    assert cli.main(["faults", *map(str, paths), "--plot", str(plot), "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["system"] for s in out["summaries"]] == ["same_dc", "pdd"]
    assert {(f["start_s"], f["end_s"]) for f in out["faults"]} == {(60, 120)}
    minutes = [m for m in out["per_minute"] if m["system"] == "pdd"]
    assert sum(m["arrivals"] for m in minutes) == 200
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_a_request_sent_again_as_the_run_looks_stuck_is_not_failed_as_stalled_at_once(tmp_path):
    """Same-DC PD, the fabric down for good: a prompt's KV stalls and only the prefills' random
    failures are left to happen. A failure that takes the P holding it down sends it again to
    the other P: that is progress, so the run is judged stuck only after it (it used to fail the
    new attempt as `stalled` in the same instant and leave it prefilling on the other P, holding
    KV at the end)."""
    cfg = config(tmp_path, roles=(("prefill", 2), ("decode", 1)), observe={"sample_s": 0})
    out = simulate(_with_faults(cfg, {"random": [{"role": "prefill", "mtbf_s": 5.0, "mttr_s": 1.0}],
                                      "events": [{"kind": "link_down", "link": "rdma:a", "start_s": 0.05,
                                                  "duration_s": None}]}),
                   workload((0.0, 8000, 10)), seed=1, check_invariants=True)
    r = out.requests.iloc[0]
    assert r.status == "failed" and r.failure == "stalled"
    assert out.summary["retries"] == 2                     # each new attempt prefilled and stalled
