"""Capacity in offered-load terms: sessions started over a horizon, the search on the stationary
window, its rule for a load knob SLO attainment is not monotone in, and early stop."""
import math
from collections import Counter

import pytest

from pddsim.config import bundled, load_config
from pddsim.experiments import capacity
from pddsim.experiments.capacity import distinguishable, find_capacity, load_knob
from pddsim.sim import load_workload, simulate
from pddsim.stationary import window_figures
from pddsim.workload.horizon import resample, sessions_of
from pddsim.workload.synthetic import AgentSpec, agent_workload

KNOBS = dict(session_rate=0.2, turns_mean=5, system_tokens=512, context_mean=3000,
             context_sigma=0.3, append_mean=1000, append_sigma=0.5, long_prob=0.0, output_mean=200,
             output_sigma=0.3, think_mean=2, think_sigma=0.5, reset_prob=0, max_context=0)


def horizon_config(make_config, rate: float, horizon_s: float = 400, **overrides):
    return make_config(workload={"replay": "closed", "horizon_s": horizon_s,
                                 "session_rate_rps": rate,
                                 "synthetic": {"kind": "agent", "knobs": KNOBS}}, **overrides)


def two_speed_table(path, decode_s: float):
    """Prefill 10 ms + 10 us a token; a decode step `decode_s` whatever the batch."""
    rows = ["phase,tokens,context,time_s"]
    for t in (0, 1_000_000):
        for ctx in (0, 10**10):
            rows += [f"prefill,{t},{ctx},{0.01 + 1e-5 * t}", f"decode,{t},{ctx},{decode_s}"]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_a_horizon_generates_sessions_at_the_rate(make_config):
    """An Agent workload with a horizon has ~rate x horizon sessions, all started inside it; the
    same seed gives the same workload."""
    cfg = horizon_config(make_config, 2.0, 500)
    w = load_workload(cfg)
    starts = [w.requests[m[0]].arrival_s for m in sessions_of(w)]
    assert abs(len(starts) - 1000) < 4 * 1000 ** 0.5
    assert 0 <= min(starts) and max(starts) < 500
    assert [r.hash_ids for r in load_workload(cfg).requests] == [r.hash_ids for r in w.requests]
    assert load_knob(cfg) == "session_rate_rps"


def _by_session(workload):
    """Each session's start and its turns' (input, output, think, blocks), in start order."""
    sessions = sorted(sessions_of(workload), key=lambda m: workload.requests[m[0]].arrival_s)
    return [(workload.requests[m[0]].arrival_s,
             [(r.input_tokens, r.output_tokens, r.think_s, r.hash_ids)
              for r in (workload.requests[i] for i in m)]) for m in sessions]


@pytest.mark.parametrize("recorded", [False, True])
def test_two_loads_share_their_sessions(make_config, recorded):
    """Common random numbers: the workload at twice the session rate starts the same sessions,
    turn for turn, at half the times, and more of them; so a capacity search's runs at two loads
    differ in load, not in draws (an Agent generator's sessions, and a recorded set resampled)."""
    def at(rate):
        cfg = horizon_config(make_config, rate, 300)
        source = agent_workload(AgentSpec(sessions=15, **KNOBS), seed=4) if recorded else None
        return _by_session(load_workload(cfg, source))
    slow, fast = at(0.5), at(1.0)
    assert len(fast) > len(slow) > 100
    for (t_slow, turns_slow), (t_fast, turns_fast) in zip(slow, fast):
        assert t_fast == pytest.approx(t_slow / 2, abs=1e-9)
        assert turns_fast == turns_slow


def test_resampling_keeps_each_session_and_gives_copies_their_own_blocks():
    """Each copy is one of the recorded sessions, whole (lengths, think times, which turn follows
    which); blocks shared by sessions (the system prompt) stay shared, a session's own blocks are
    fresh in every copy."""
    base = agent_workload(AgentSpec(sessions=20, **KNOBS), seed=0)
    out = resample(base, 2.0, 100, seed=3)
    assert out.requests == resample(base, 2.0, 100, seed=3).requests
    shape = {tuple((base.requests[i].input_tokens, base.requests[i].output_tokens,
                    base.requests[i].think_s) for i in m) for m in sessions_of(base)}
    copies = sessions_of(out)
    assert abs(len(copies) - 200) < 4 * 200 ** 0.5
    system = set(base.requests[0].hash_ids[:512 // 64])
    owners: Counter = Counter()
    for m in copies:
        reqs = [out.requests[i] for i in m]
        assert tuple((r.input_tokens, r.output_tokens, r.think_s) for r in reqs) in shape
        assert all(r.follows == (-1 if k == 0 else m[k - 1]) for k, r in enumerate(reqs))
        owners.update({h for r in reqs for h in r.hash_ids})
    assert all(owners[h] == len(copies) for h in system)
    assert all(n == 1 for h, n in owners.items() if h not in system)
    assert [r.arrival_s for r in out.requests] == sorted(r.arrival_s for r in out.requests)


def test_steady_rate_is_the_load_not_the_speed(make_config, tmp_path):
    """Metamorphic: two deployments whose answers differ only in decode speed (10 vs 40 ms a
    token), both below capacity, fed the same session starts: their steady-state rates agree within
    sampling error (they issue what the sessions ask), though their whole-run rates differ (the
    slow one's last sessions take longer to drain)."""
    rate = {}
    for decode_s in (0.01, 0.04):
        cfg = horizon_config(make_config, 0.6, 1000, slo={"ttft_s": 5.0, "tpot_s": 0.05},
                             perf={"kind": "table", "table": two_speed_table(
                                 tmp_path / f"t{decode_s}.csv", decode_s)})
        s = simulate(cfg, load_workload(cfg)).summary
        assert s["steady_stationary"] and s["steady_slo_attainment"] == 1.0
        rate[decode_s] = s
    fast, slow = rate[0.01], rate[0.04]
    assert not distinguishable((fast["steady_rps_lo"], fast["steady_rps_hi"]),
                               (slow["steady_rps_lo"], slow["steady_rps_hi"]))
    assert fast["steady_rps"] == pytest.approx(slow["steady_rps"], rel=0.03)
    assert slow["achieved_rps"] < 0.95 * fast["achieved_rps"]


def test_capacity_is_the_steady_rate_at_the_highest_passing_load(make_config):
    """The search reports the steady rate of its highest passing load, which sits below the
    lowest failing load it tried; every load it tried above the capacity's failed."""
    cfg = horizon_config(make_config, 0.5, roles=(("colocated", 1),), per_token=1e-4)
    cap = find_capacity(cfg, load_workload(cfg))
    assert cap.found and cap.status == "found"
    s = cap.result.summary
    window = window_figures(cap.result.requests, s["steady_window_start_s"], s["steady_window_end_s"])
    assert cap.capacity_rps == cap.rate_rps == window["steady_rps"]
    assert s["steady_rps"] in (None, cap.capacity_rps)     # None: the window's trend test flagged it
    assert cap.interval[0] <= cap.capacity_rps <= cap.interval[1]
    assert cap.loads[cap.load]
    failing = [load for load, ok in cap.loads.items() if not ok]
    assert failing and cap.load < min(failing)
    assert all(not ok for load, ok in cap.loads.items() if load > cap.load)
    assert cap.summary()["capacity_runs"] == len(cap.loads)


@pytest.mark.parametrize("start", [0.3, 0.9, 2.0])
def test_a_search_from_another_start_finds_the_same_capacity(make_config, start):
    """Started below, near or far above the capacity, the search tries loads of the configured
    value's lattice only, and the loads share their sessions: it ends at the same load with the
    same figures as the search from the configured value."""
    cfg = horizon_config(make_config, 0.5, roles=(("colocated", 1),), per_token=1e-4)
    scratch = find_capacity(cfg, load_workload(cfg))
    other = find_capacity(cfg, load_workload(cfg), start=start)
    assert (other.load, other.capacity_rps, other.interval) == (
        scratch.load, scratch.capacity_rps, scratch.interval)
    lattice = capacity.Lattice(0.5, 0.03, False, None)
    assert lattice.steps == 32
    positions = [32 * math.log2(load / 0.5) for load in other.loads]
    assert all(k == pytest.approx(round(k), abs=1e-9) for k in positions)


def test_a_search_given_a_load_to_beat_tries_it_first(make_config):
    """Given a load to beat above the capacity, the search ends in one failing run there; given
    the capacity's own load, it passes there and finds the capacity a search without it finds,
    one run more at most."""
    cfg = horizon_config(make_config, 0.5, roles=(("colocated", 1),), per_token=1e-4)
    scratch = find_capacity(cfg, load_workload(cfg))
    failing = min(load for load, ok in scratch.loads.items() if not ok)
    beaten = find_capacity(cfg, load_workload(cfg), beat=failing * 1.001)
    assert beaten.status == capacity.BELOW_BEAT and beaten.loads == {failing: False}
    level = find_capacity(cfg, load_workload(cfg), beat=scratch.load)
    assert (level.load, level.capacity_rps, level.interval) == (
        scratch.load, scratch.capacity_rps, scratch.interval)
    assert set(scratch.loads) <= set(level.loads) and len(level.loads) <= len(scratch.loads) + 1
    lattice = capacity.Lattice(0.5, 0.03, False, None)
    assert lattice.load(lattice.at_or_below(scratch.load)) == scratch.load
    assert lattice.load(lattice.at_or_below(failing * 0.999)) < failing
    assert capacity.Lattice(4, 0.03, True, 16).at_or_below(6.5) == 6


def test_a_run_that_never_saturates_reports_a_lower_bound(make_config):
    cfg = horizon_config(make_config, 0.05, roles=(("colocated", 4),))
    cap = find_capacity(cfg, load_workload(cfg), max_doublings=2)
    assert not cap.found and cap.status == "never saturated"
    assert cap.load == pytest.approx(0.2)
    assert cap.summary()["capacity_lower_bound_rps"] == cap.rate_rps > 0


def test_a_run_overloaded_from_the_start_is_not_a_rate(make_config):
    """Sessions start far faster than one slow instance serves them: the backlog grows all
    along, the run is flagged non-stationary and the search reports that, not a rate."""
    cfg = horizon_config(make_config, 4.0, 120, roles=(("colocated", 1),), per_token=1e-3)
    s = simulate(cfg, load_workload(cfg)).summary
    assert not s["steady_stationary"] and s["steady_rps"] is None
    cap = find_capacity(cfg, load_workload(cfg), max_doublings=1)
    assert cap.status == "never stationary" and cap.capacity_rps is None


def test_a_window_flagged_as_drifting_still_passes_on_its_slo(make_config, monkeypatch):
    """The trend test flags chance drifts at light loads: the search judges a run on its
    window's SLO share, so a flag alone does not fail a load (the capacity is the same as with
    the flag never raised), and the run at capacity reports its flag."""
    cfg = horizon_config(make_config, 0.5, roles=(("colocated", 1),), per_token=1e-4)
    w = load_workload(cfg)
    honest = find_capacity(cfg, w)
    real = capacity.simulate

    def flagged_run(*args, **kwargs):
        res = real(*args, **kwargs)
        res.summary["steady_stationary"] = False
        return res
    monkeypatch.setattr(capacity, "simulate", flagged_run)
    flagged = find_capacity(cfg, w)
    assert flagged.loads == honest.loads and flagged.capacity_rps == honest.capacity_rps
    assert flagged.summary()["capacity_stationary"] is False


def test_early_stop_stops_only_failing_runs(make_config):
    cfg = horizon_config(make_config, 0.5, roles=(("colocated", 1),), per_token=1e-4)
    w = load_workload(cfg)
    with_stop, without = (find_capacity(cfg, w, early_stop=e) for e in (True, False))
    assert with_stop.stopped_early > 0 and without.stopped_early == 0
    assert with_stop.loads == without.loads
    assert (with_stop.capacity_rps, with_stop.load) == (without.capacity_rps, without.load)


@pytest.mark.parametrize("name", ["paper/same_dc_pd.yaml", "paper/pdd.yaml"])
def test_early_stop_never_changes_the_capacity_on_the_bundled_scenarios(name):
    """The paper scenarios, shortened (15 minutes of starts, 4 turns a session, so that each
    run still reaches its plateau): the same loads pass and fail, the same capacity, with and
    without early stop, and some runs did stop early."""
    cfg = load_config(bundled(name), values={"workload.horizon_s": 900,
                                             "workload.synthetic.knobs.turns_mean": 4})
    w = load_workload(cfg)
    with_stop, without = (find_capacity(cfg, w, early_stop=e, rel_tol=0.1) for e in (True, False))
    assert with_stop.loads == without.loads
    assert (with_stop.capacity_rps, with_stop.load) == (without.capacity_rps, without.load)
    assert with_stop.stopped_early > 0


def test_the_cli_says_never_stationary_rather_than_that_the_slo_held(make_config, tmp_path,
                                                                      capsys, monkeypatch):
    import yaml

    from pddsim.cli import main
    real = capacity.find_capacity
    monkeypatch.setattr(capacity, "find_capacity", lambda *a, **kw: real(*a, **kw, max_doublings=1))
    cfg = horizon_config(make_config, 4.0, 120, roles=(("colocated", 1),), per_token=1e-3)
    path = tmp_path / "overloaded.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude={"base_dir"},
                                                  exclude_none=True)))
    assert main(["capacity", str(path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("capacity not found: no load tried became stationary") and "held" not in out
