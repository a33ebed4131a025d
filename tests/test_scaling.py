"""Elastic pools (`scaling:` per instance group): a fixed policy is today's run, a static schedule
is the same run bit for bit, held GPU-seconds are what the run costs (by hand on a small case), a
retiring instance drains before it stops, a start-up lost to a fault starts over, and every
request ends exactly once under scaling and faults together (with the invariants checked).
Small deployments with exact iteration times (tests/conftest.py)."""
import math

import numpy as np
import pandas as pd
import pytest
from conftest import config, workload

from pddsim import catalog
from pddsim.config import from_dict
from pddsim.cost import gpu_price
from pddsim.errors import InputError
from pddsim.sim import simulate
from pddsim.system import scaling

PD_ROLES = (("prefill", 1), ("decode", 1))
PDD_ROLES = (("prefill", 1), ("relay", 1), ("decode", 1))
HOST = {"weights_from": "host", "host_gb_per_s": 20.0, "init_s": 10.0}


def _startup_s(tp: int = 8) -> float:
    """By hand: the engine's 10 s, then each GPU's 1/tp of Llama-3.1-70B's weights at 20 GB/s."""
    return 10.0 + catalog.model("llama-3.1-70b").weight_bytes / tp / 20e9


def _scaled(cfg, **groups):
    """`cfg` with `scaling` (and `count`) set per group: `cluster_index={...}`, e.g. a_1={...}."""
    raw = cfg.model_dump()
    for key, sc in groups.items():
        cname, gi = key.split("_")
        group = raw["clusters"][cname]["instances"][int(gi)]
        if "count" in sc:
            group["count"] = sc.pop("count")
        group["scaling"] = sc
    return from_dict(raw, "test")


def _poisson(n=120, rate=1.0, seed=1, inputs=(500, 4000), outputs=(5, 200)):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    return workload(*[(float(a), int(i), int(o)) for a, i, o in
                      zip(t, rng.integers(*inputs, n), rng.integers(*outputs, n))])


def _same(a, b):
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.instances, b.instances, check_exact=True)
    pd.testing.assert_frame_equal(a.timeseries, b.timeseries, check_exact=True)
    for key, value in a.summary.items():
        assert b.summary[key] == value or (value != value and b.summary[key] != b.summary[key]), key


# ---- today's pools --------------------------------------------------------------------------

def test_a_fixed_policy_builds_no_controller(tmp_path):
    """Fixed (the default) starts no process and keeps no record: a run pays nothing for it."""
    cfg = config(tmp_path, roles=PD_ROLES)
    w = _poisson(60)
    plain = simulate(cfg, w)
    fixed = _scaled(cfg, a_0={"policy": "fixed"}, a_1={"policy": "fixed", "max": 1})
    assert not scaling.Elastic.needed(fixed)         # the run builds no elastic pools
    explicit = simulate(fixed, w)
    _same(plain, explicit)
    assert "gpu_hours_decode" not in explicit.summary


@pytest.mark.parametrize("roles, two", [(PD_ROLES, False), (PDD_ROLES, True)])
def test_a_static_schedule_is_the_fixed_pools_bit_for_bit(tmp_path, roles, two):
    cfg = config(tmp_path, roles=tuple((r, 2) for r, _ in roles), two_clusters=two)
    w = _poisson(150, rate=3.0)
    static = {"policy": "schedule", "schedule": {0: 2}, "day_s": 40.0}   # re-set every 40 s
    groups = {f"{c}_{i}": dict(static) for c, cl in cfg.clusters.items()
              for i, _ in enumerate(cl.instances)}
    fixed, scheduled = simulate(cfg, w), simulate(_scaled(cfg, **groups), w)
    _same(fixed, scheduled)
    span = fixed.summary["sim_duration_s"]
    for role, _ in roles:
        assert scheduled.summary[f"gpu_hours_{role}"] == pytest.approx(2 * 8 * span / 3600, rel=1e-12)
        assert scheduled.summary[f"scale_ups_{role}"] == scheduled.summary[f"scale_downs_{role}"] == 0
    assert scheduled.summary["requests_while_short_share"] == 0.0


def test_a_schedule_boundary_met_by_rounding_is_passed_once(tmp_path):
    """Hour 4 of a 10 s day is 1.666... s; on the second day the clock's 11.666... % 10 falls an
    ulp short of it. The schedule used to sleep that ulp, which does not move the clock, for ever."""
    import signal

    def hang(*_):
        raise AssertionError("the run hangs")
    cfg = _scaled(config(tmp_path, roles=PD_ROLES),
                  a_1={"policy": "schedule", "count": 2, "schedule": {4: 1, 12: 2}, "day_s": 10.0})
    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(60)
    try:
        r = simulate(cfg, _poisson(100, rate=2.0))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert r.summary["sim_duration_s"] > 30
    assert r.summary["scale_downs_decode"] >= 3 and r.summary["scale_ups_decode"] >= 3


# ---- cost of what is held ----------------------------------------------------------------------

def test_held_gpu_seconds_cost_by_hand(tmp_path):
    """One prefill held throughout, a second decoder asked for at noon of a 200 s day (100 s):
    held from then, serving after its start-up; the cost per hour is the GPUs held on average
    at their price."""
    cfg = _scaled(config(tmp_path, roles=PD_ROLES),
                  a_1={"policy": "schedule", "max": 2, "schedule": {0: 1, 12: 2}, "day_s": 200.0,
                       "startup": HOST})
    r = simulate(cfg, _poisson(150, rate=1.0))
    s, inst = r.summary, r.instances.set_index("instance")
    end = s["sim_duration_s"]
    assert 100 < end < 200                         # (before the next midnight)
    assert inst.loc["a/decode1", "held_s"] == pytest.approx(end - 100.0, rel=1e-12)
    assert inst.loc["a/decode0", "held_s"] == inst.loc["a/prefill0", "held_s"] == end
    assert s["gpu_hours_decode"] == pytest.approx(8 * (2 * end - 100.0) / 3600, rel=1e-12)
    assert s["gpu_hours_prefill"] == pytest.approx(8 * end / 3600, rel=1e-12)
    price = gpu_price(cfg, "h100-sxm")
    assert s["cost_per_hour"] == pytest.approx(price * (8 + 8 + 8 * (end - 100.0) / end), rel=1e-12)
    assert s["bcr"] == pytest.approx(s["goodput_rps"] * 3600 / s["cost_per_hour"], rel=1e-12)
    assert s["scale_ups_decode"] == 1 and s["scale_downs_decode"] == 0
    # short from noon until it serves, and the requests in the system meanwhile
    assert s["short_s"] == pytest.approx(_startup_s(), rel=1e-12)
    req = r.requests
    meets = (req["arrival_s"] <= 100.0 + _startup_s()) & (req["finish_s"] >= 100.0)
    assert s["requests_while_short_share"] == pytest.approx(meets.mean())
    # a busy share is over the time held
    assert inst.loc["a/decode1", "busy_share"] <= 1.0


def test_a_retiring_instance_drains_then_stops(tmp_path):
    """Two decoders each busy with a long request at 50 s, when the schedule wants one: one
    drains: it takes no new work, finishes its request, stops at the first poll after (and
    costs until then); requests after 50 s all go to the other."""
    cfg = _scaled(config(tmp_path, roles=PD_ROLES),
                  a_1={"policy": "schedule", "count": 2, "schedule": {0: 2, 12: 1},
                       "day_s": 100.0, "drain_poll_s": 1.0})
    long = [(40.0, 1000, 3000), (40.5, 1000, 3000)]
    later = [(55.0 + k, 800, 20) for k in range(20)]
    r = simulate(cfg, workload(*long, *later))
    inst = r.instances.set_index("instance")
    end = r.summary["sim_duration_s"]
    held = inst.loc[["a/decode0", "a/decode1"], "held_s"]
    retired = held.idxmin()
    assert held.max() == end and 50.0 < held.min() < end
    # it decoded its own long request and nothing else
    assert inst.loc[retired, "tokens_decoded"] == 3000 - 1
    kept = "a/decode0" if retired == "a/decode1" else "a/decode1"
    assert inst.loc[kept, "tokens_decoded"] == 3000 - 1 + 20 * (20 - 1)
    first = r.requests.set_index("request").loc[[0, 1], "finish_s"]
    own_finish = first.max() if inst.loc[retired, "held_s"] >= first.max() else first.min()
    stop = inst.loc[retired, "held_s"]
    assert own_finish <= stop < own_finish + 1.0
    assert (stop - 50.0) == pytest.approx(round(stop - 50.0), abs=1e-9)   # on the poll grid
    assert r.summary["scale_downs_decode"] == 1
    assert (r.requests["status"] == "completed").all()


def test_an_instance_lost_while_starting_starts_over(tmp_path):
    """A second decoder asked for at 100 s dies at 105 s for 15 s: once repaired it starts from
    scratch, so its pool is short from 100 s to 120 s + its start-up."""
    raw = _scaled(config(tmp_path, roles=PD_ROLES),
                  a_1={"policy": "schedule", "max": 2, "schedule": {0: 1, 12: 2}, "day_s": 200.0,
                       "startup": HOST}).model_dump()
    raw["faults"] = {"events": [{"kind": "instance_down", "instance": "a/decode1", "start_s": 105.0,
                                 "duration_s": 15.0}]}
    r = simulate(from_dict(raw, "test"), _poisson(150, rate=1.0), check_invariants=True)
    assert r.summary["sim_duration_s"] < 200.0
    assert r.summary["short_s"] == pytest.approx(120.0 + _startup_s() - 100.0, rel=1e-12)
    inst = r.instances.set_index("instance")
    assert inst.loc["a/decode1", "held_s"] == pytest.approx(r.summary["sim_duration_s"] - 100.0)


# ---- the reactive controller ------------------------------------------------------------------

def _burst():
    """Two minutes of heavy prefill load, then ten of light."""
    heavy = _poisson(600, rate=5.0, seed=2, inputs=(20_000, 60_000), outputs=(2, 20))
    light = _poisson(60, rate=0.1, seed=3, inputs=(500, 2000), outputs=(2, 20))
    t_end = heavy.requests[-1].arrival_s
    return workload(*[(r.arrival_s, r.input_tokens, r.output_tokens) for r in heavy.requests],
                    *[(t_end + r.arrival_s, r.input_tokens, r.output_tokens) for r in light.requests])


def test_reactive_scales_up_under_load_and_down_after(tmp_path):
    cfg = config(tmp_path, roles=PD_ROLES, per_token=1e-4)
    reactive = {"policy": "reactive", "max": 4, "interval_s": 10.0, "cooldown_s": 30.0,
                "queue_per_instance": 4, "startup": HOST}
    r = simulate(_scaled(cfg, a_0=reactive), _burst(), check_invariants=True)
    s = r.summary
    assert s["scale_ups_prefill"] >= 1 and s["scale_downs_prefill"] >= 1
    end = s["sim_duration_s"]
    assert 8 * end / 3600 < s["gpu_hours_prefill"] < 4 * 8 * end / 3600
    static = simulate(_scaled(cfg, a_0={"policy": "fixed", "count": 4}), _burst())
    assert s["cost_per_hour"] < static.summary["cost_per_hour"]
    assert s["ttft_p90_s"] < simulate(cfg, _burst()).summary["ttft_p90_s"]   # than one prefill


def test_the_cooldown_spaces_changes(tmp_path):
    """A cooldown longer than the run allows one change of the wanted count (its first)."""
    cfg = config(tmp_path, roles=PD_ROLES, per_token=1e-4)
    reactive = {"policy": "reactive", "max": 4, "interval_s": 10.0, "cooldown_s": 1e9,
                "queue_per_instance": 4, "startup": HOST}
    s = simulate(_scaled(cfg, a_0=reactive), _burst()).summary
    assert s["scale_ups_prefill"] >= 1 and s["scale_downs_prefill"] == 0


def test_a_latency_target_reads_recent_requests(tmp_path):
    """A TTFT target scales prefill up when recent requests' TTFT exceeds it."""
    cfg = config(tmp_path, roles=PD_ROLES, per_token=1e-4)
    reactive = {"policy": "reactive", "max": 3, "interval_s": 10.0, "cooldown_s": 30.0,
                "ttft_s": 2.0, "startup": HOST}
    s = simulate(_scaled(cfg, a_0=reactive), _burst()).summary
    assert s["scale_ups_prefill"] >= 1


# ---- conservation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_request_ends_once_under_scaling_and_faults(tmp_path, seed):
    """PDD with prefill and MD pools scaled by their own controllers while instances fail at
    random and one is lost as the controller scales up: the run ends, each request ends exactly
    once (the run checks it), the engine's rules hold after every event (memory never
    over-committed), and nothing is dropped."""
    cfg = config(tmp_path, roles=PDD_ROLES, two_clusters=True, per_token=1e-4,
                 wan={"bandwidth_gbps": 10, "rtt_ms": 20})
    reactive = {"policy": "reactive", "max": 3, "interval_s": 5.0, "cooldown_s": 10.0,
                "queue_per_instance": 2, "kv_occupancy": 0.5, "tpot_s": 0.02,
                "startup": {**HOST, "init_s": 5.0}}
    raw = _scaled(cfg, a_0=dict(reactive), b_0=dict(reactive)).model_dump()
    raw["faults"] = {"max_retries": 2, "transfer_timeout_s": 30.0,
                     "events": [{"kind": "instance_down", "instance": "a/prefill1", "start_s": 12.0,
                                 "duration_s": 8.0},
                                {"kind": "instance_down", "instance": "b/decode1", "start_s": 20.0,
                                 "duration_s": 5.0}],
                     "random": [{"role": "decode", "mtbf_s": 60.0, "mttr_s": 10.0},
                                {"role": "prefill", "mtbf_s": 90.0, "mttr_s": 10.0}]}
    w = _poisson(300, rate=4.0, seed=seed, inputs=(2000, 30_000), outputs=(20, 400))
    r = simulate(from_dict(raw, "test"), w, seed=seed, check_invariants=True)
    assert len(r.requests) == 300
    assert r.requests["request"].is_unique
    assert set(r.requests["status"]) <= {"completed", "failed"}
    assert r.summary["scale_ups_prefill"] + r.summary["scale_ups_decode"] >= 1


# ---- input ----------------------------------------------------------------------------------

@pytest.mark.parametrize("scaling, fragment", [
    ({"policy": "schedule"}, "needs schedule"),
    ({"policy": "schedule", "max": 2, "schedule": {0: 3}}, "scaling.schedule: 3 instances"),
    ({"policy": "schedule", "max": 2, "schedule": {24: 1}}, "hour 24"),
    ({"policy": "reactive", "max": 2}, "needs a target"),
    ({"policy": "fixed", "max": 2}, "scaling.max"),
    ({"policy": "reactive", "min": 2, "max": 3, "queue_per_instance": 1}, "count 1 is not within"),
    ({"policy": "fixed", "schedule": {0: 1}}, "schedule goes with policy 'schedule'"),
    ({"policy": "reactive", "kv_occupancy": 1.5}, "kv_occupancy"),
    ({"policy": "elastic"}, "policy"),
])
def test_bad_scaling_is_an_input_error_naming_the_field(tmp_path, scaling, fragment):
    raw = config(tmp_path, roles=PD_ROLES).model_dump()
    raw["clusters"]["a"]["instances"][1]["scaling"] = scaling
    with pytest.raises(InputError, match="clusters.a.instances.1") as err:
        from_dict(raw, "test")
    assert fragment in str(err.value)


def test_startup_time_by_hand():
    """From storage the node's read is shared by its 8 GPUs: the whole checkpoint at 5 GB/s."""
    from pddsim.config import InstanceGroup
    from pddsim.system.deployment import startup_s
    model = catalog.model("llama-3.1-70b")
    group = InstanceGroup(role="decode", count=1, tp=8)
    assert startup_s(model, group, 8) == pytest.approx(60.0 + model.weight_bytes / 5e9, rel=1e-12)
    host = InstanceGroup(role="decode", count=1, tp=8, scaling={"startup": HOST})
    assert startup_s(model, host, 8) == pytest.approx(_startup_s(), rel=1e-12)
    assert math.isfinite(startup_s(model, InstanceGroup(role="decode", count=1, tp=16), 8))


# ---- the day study ----------------------------------------------------------------------------

def test_a_day_curve_mean():
    from pddsim.workload.synthetic import curve_mean
    assert curve_mean("") == pytest.approx(1.0)
    assert curve_mean("0:0,12:2") == pytest.approx(1.0)          # a triangle around the day
    assert curve_mean("0:0.5,6:0.5,6.001:1.5,18:1.5,18.001:0.5") == pytest.approx(1.0, abs=1e-3)


def test_the_day_study_at_a_tiny_size():
    """Static at peak holds every configured GPU all day; elastic holds at most that, and the
    paper's MD pool, sized for long contexts at the peak, shrinks."""
    from pddsim.config import bundled, load_config
    from pddsim.experiments.elastic import day_study
    cfg = load_config(bundled("paper/pdd.yaml"), ["workload.synthetic.knobs.session_rate=0.05"])
    study = day_study([cfg], day_s=900.0)
    static, elastic = study.summaries
    t = study.table.set_index("mode")
    assert list(t.index) == ["static at peak", "elastic"]
    assert t.loc["static at peak", "GPU-h prefill"] == pytest.approx(
        32 * static["sim_duration_s"] / 3600)
    assert t.loc["elastic", "GPU-h decode"] <= 32 * elastic["sim_duration_s"] / 3600
    assert t.loc["elastic", "GPU-h decode"] < t.loc["static at peak", "GPU-h decode"]
    assert elastic["requests_total"] == static["requests_total"]


def test_the_elastic_command_refuses_a_bad_curve_in_one_line(capsys, input_error):
    from pddsim import cli
    code = cli.main(["elastic", "paper/pdd", "--curve", "0:1,25:2"])
    input_error(code, capsys.readouterr().err, "day curve", "hours in [0, 24)")


def test_a_bad_scaling_section_is_one_line_naming_the_field(tmp_path, capsys, input_error):
    import yaml

    from pddsim import cli
    raw = config(tmp_path, roles=PD_ROLES).model_dump(exclude={"base_dir"})
    raw["clusters"]["a"]["instances"][0]["scaling"] = {"policy": "reactive", "max": 2,
                                                       "interval_s": 0, "ttft_s": 1}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    input_error(cli.main(["validate", str(path)]), capsys.readouterr().err,
                "clusters.a.instances.0.scaling.interval_s")
