"""compare, capacity and check: the commands planners and CI pipelines build on."""
import json
from pathlib import Path

import pytest
import yaml

from pddsim.cli import main
from pddsim.experiments.capacity import at_load, find_capacity
from pddsim.experiments.compare import (
    compare,
    compare_across_loads,
    format_comparison,
    relative_change,
)
from pddsim.sim import load_workload, simulate
from pddsim.workload.synthetic import AgentSpec, agent_workload, poisson_workload

ROOT = Path(__file__).resolve().parents[1]

CLOSED = {"trace": "x", "replay": "closed"}


def agents(sessions: int):
    """Small agent sessions whose turns append 1K tokens to a 3K context, 2 s think time."""
    return agent_workload(AgentSpec(
        sessions=sessions, session_rate=0.2, turns_mean=5, system_tokens=512, context_mean=3000,
        context_sigma=0.3, append_mean=1000, append_sigma=0.5, long_prob=0.0, output_mean=40,
        output_sigma=0.3, think_mean=2, think_sigma=0.5, reset_prob=0, max_context=0), seed=0)


def test_capacity_grows_with_instances(make_config):
    w = poisson_workload(300, 10, 3000, 60, seed=0)
    one = find_capacity(make_config(roles=(("colocated", 1),)), w)
    two = find_capacity(make_config(roles=(("colocated", 2),)), w)
    assert one.result.summary["slo_attainment"] >= 0.9
    assert 1.6 < two.capacity_rps / one.capacity_rps < 2.4


@pytest.mark.parametrize("workload, knob", [
    ({}, "time_scale"),                                                # open loop, recorded starts
    (CLOSED, "time_scale"),                                            # closed loop, recorded starts
    ({**CLOSED, "session_start": "poisson", "session_rate_rps": 0.5}, "time_scale"),
    ({**CLOSED, "session_start": "concurrent", "concurrent_sessions": 2}, "concurrent_sessions"),
])
def test_capacity_is_a_rate_the_run_achieved(make_config, workload, knob):
    """Re-running at the reported load achieves exactly the reported rate within the SLO target,
    and a load 10% above it breaks the SLO: closed loop can fail too. In closed loop the trace's
    schedule (requests over the scaled recorded span) promises more than the run achieves."""
    cfg = make_config(roles=(("colocated", 1),), per_token=1e-4, workload={**CLOSED, **workload})
    w = agents(30)
    cap = find_capacity(cfg, w)
    assert cap.found and cap.knob == knob
    again = simulate(at_load(cfg, cap.load), w).summary
    assert again["achieved_rps"] == cap.capacity_rps
    assert again["slo_attainment"] >= cfg.slo.target
    above = cap.load + 1 if knob == "concurrent_sessions" else cap.load * 1.1
    assert simulate(at_load(cfg, above), w).summary["slo_attainment"] < cfg.slo.target
    if workload == CLOSED:
        span = w.requests[-1].arrival_s - w.requests[0].arrival_s
        assert cap.capacity_rps < 0.8 * len(w) / (span / cap.load)


def test_capacity_not_found_when_the_slo_never_breaks(make_config, tmp_path, capsys):
    """Four closed-loop sessions cannot load two instances: every session in flight at once still
    meets the SLO, so the search says it found no capacity and gives the rate it reached."""
    cfg = make_config(roles=(("colocated", 2),), workload=CLOSED)
    cap = find_capacity(cfg, agents(4))
    assert not cap.found and cap.capacity_rps is None
    assert cap.lower_bound_rps == cap.result.summary["achieved_rps"] > 0
    summary = cap.summary()
    assert summary["capacity_found"] is False
    assert summary["capacity_lower_bound_rps"] == cap.lower_bound_rps
    raw = cfg.model_dump(exclude={"base_dir"}, exclude_none=True)
    raw["workload"] = {"replay": "closed",
                       "synthetic": {"kind": "agent", "knobs": agents(4).extra["spec"]}}
    path = tmp_path / "idle.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["capacity", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("capacity not found") and "lower bound" in out
    assert main(["capacity", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["capacity_rps"] is None and shown["capacity_lower_bound_rps"] == pytest.approx(
        cap.lower_bound_rps)


def test_compare_runs_every_system_on_one_workload(make_config):
    w = poisson_workload(200, 5, 3000, 60, seed=0)
    small, big = make_config(roles=(("colocated", 1),)), make_config(roles=(("colocated", 3),))
    rows = compare([small, big], w)
    assert [r["requests_total"] for r in rows] == [200, 200]
    assert rows[1]["ttft_p90_s"] < rows[0]["ttft_p90_s"]
    table = format_comparison(rows)
    assert "TTFT P90 s" in table and "%)" in table      # deltas against the first


def test_compare_and_capacity_json(config_file, capsys):
    a = config_file("one", (("colocated", 1),), 8)
    b = config_file("two", (("colocated", 2),), 8)
    assert main(["compare", str(a), str(b), "--json", "--quiet"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["system"] for r in rows] == ["one", "two"]
    assert main(["capacity", str(a), "--json"]) == 0
    cap = json.loads(capsys.readouterr().out)
    assert cap["capacity_rps"] > 0 and "bcr" in cap and cap["slo_attainment"] >= 0.9


def test_check_passes_then_fails_when_a_pin_moves(config_file, tmp_path, capsys):
    cfg = config_file("pinned", (("colocated", 1),), 5)
    golden = tmp_path / "golden.yaml"
    golden.write_text(yaml.safe_dump({"scenarios": [{"config": cfg.name, "pins": {
        "ttft_p50_s": {"value": 0, "rel": 0.05}, "requests_completed": {"value": 0, "abs": 0}}}]}))
    assert main(["check", str(golden), "--update"]) == 0
    assert main(["check", str(golden)]) == 0
    pinned = yaml.safe_load(golden.read_text())
    p50 = pinned["scenarios"][0]["pins"]["ttft_p50_s"]
    p50["value"] *= 1.04                                   # inside the 5% tolerance
    golden.write_text(yaml.safe_dump(pinned))
    assert main(["check", str(golden)]) == 0
    p50["value"] *= 1.10                                   # now outside it
    golden.write_text(yaml.safe_dump(pinned))
    capsys.readouterr()
    assert main(["check", str(golden)]) == 1
    out = capsys.readouterr()
    assert "MOVED" in out.out and "moved beyond tolerance" in out.err


def test_check_rejects_a_malformed_golden_file(tmp_path, capsys):
    golden = tmp_path / "golden.yaml"
    golden.write_text("scenarios:\n- config: x.yaml\n  pins: {ttft_p50_s: {value: 1}}\n")
    assert main(["check", str(golden)]) == 2
    assert "give exactly one of rel and abs" in capsys.readouterr().err


def test_paper_figures_say_fitted_or_predicted_and_use_relative_tolerances():
    from pddsim.experiments import paper
    assert {f.basis for f in paper.FIGURES} == {paper.FITTED, paper.PREDICTED}
    rld = next(f for f in paper.FIGURES if f.label.startswith("RLD share"))
    assert not rld.matches(0.023) and rld.matches(0.062 * 1.25) and not rld.matches(0.062 * 1.35)
    same = {"ttft_p50_s": 1.0, "ttft_p90_s": 2.0, "ttft_mean_s": 1.0, "goodput_rps": 1.0, "bcr": 1.0,
            "cost_per_hour": 100.0}
    pdd = {**same, "rld_token_share": 0.05, "wan_bytes": 1.0, "wan_bytes_no_drc": 9.0}
    text = paper.format_figures(paper.figures_table(same, {**same, "ttft_p99_s": 3.0}, pdd))
    assert "fitted" in text and "predicted" in text


def test_compare_across_loads_table_json_and_plot(config_file, tmp_path, capsys):
    """`compare --loads` runs every system at fractions of the first one's capacity: at load 1.0
    the first system's rate is its capacity; TTFT grows with load; deltas are against the first."""
    a = config_file("one", (("colocated", 1),), 8)
    b = config_file("two", (("colocated", 2),), 8)
    plot = tmp_path / "loads.png"
    assert main(["compare", str(a), str(b), "--loads", "0.5:1.0:0.5", "--json", "--quiet",
                 "--plot", str(plot)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert plot.read_bytes().startswith(b"\x89PNG")
    points = out["points"]
    assert [(p["load"], p["system"]) for p in points] == [
        (0.5, "one"), (0.5, "two"), (1.0, "one"), (1.0, "two")]
    at = {(p["load"], p["system"]): p for p in points}
    assert at[1.0, "one"]["achieved_rps"] == out["capacity_rps"]
    assert at[1.0, "one"]["time_scale"] == out["knob_at_capacity"]
    assert at[0.5, "one"]["time_scale"] == pytest.approx(out["knob_at_capacity"] / 2)
    assert at[0.5, "one"]["achieved_rps"] == pytest.approx(out["capacity_rps"] / 2)   # open loop
    assert at[0.5, "one"]["ttft_p90_s"] < at[1.0, "one"]["ttft_p90_s"]
    for load in (0.5, 1.0):
        two, one = at[load, "two"], at[load, "one"]
        assert one["ttft_p50_delta"] == 0.0
        assert two["ttft_p50_delta"] == pytest.approx(two["ttft_p50_s"] / one["ttft_p50_s"] - 1)
        assert two["ttft_mean_delta"] < 0                   # a second instance halves the queue
    assert main(["compare", str(a), str(b), "--loads", "0.5:1.0:0.5", "--quiet"]) == 0
    table = capsys.readouterr().out
    assert "capacity" in table and "load 0.5" in table and "TTFT mean s" in table and "%)" in table


@pytest.mark.parametrize("argv, says", [
    (["--loads", "1:0.5:0.1"], "START:STOP:STEP"),
    (["--loads", "a:b"], "START:STOP:STEP"),
    (["--plot", "x.png"], "--plot needs --loads"),
])
def test_compare_loads_bad_arguments(config_file, input_error, capsys, argv, says):
    a = config_file("one", (("colocated", 1),), 8)
    input_error(main(["compare", str(a), *argv]), capsys.readouterr().err, says)


def test_deltas_point_the_way_the_value_moved_whatever_its_sign():
    """A margin falling from -55.9 to -101.5 $/h got worse: -82%, not the +82% of value / base - 1."""
    rows = [{"system": "a", "margin_per_hour": -55.9, "cost_per_hour": 100.0},
            {"system": "b", "margin_per_hour": -101.5, "cost_per_hour": 50.0},
            {"system": "c", "margin_per_hour": 20.0, "cost_per_hour": 0.0}]
    table = format_comparison(rows)
    assert "-101.5 (-82%)" in table and "20.0 (+136%)" in table and "50.0 (-50%)" in table
    assert relative_change(-55.9, -101.5) == pytest.approx(-0.8157, abs=1e-4)
    assert relative_change(0.0, 1.0) is None and relative_change(None, 1.0) is None


def test_compare_refuses_mixed_slos_unless_allowed_then_says_and_shows_them(input_error, capsys):
    """same_dc_pd's TTFT SLO is 5 s, paper/pdd's 10 s: their goodputs answer different questions."""
    small = ["--trace", str(ROOT / "traces/agent_default.jsonl"), "--set", "workload.limit=30", "--quiet"]
    pair = ["compare", "configs/same_dc_pd.yaml", "configs/paper/pdd.yaml"]
    code = main([*pair, *small])
    input_error(code, capsys.readouterr().err, "SLOs differ", "same_dc_pd: TTFT 5 s",
                "paper_pdd: TTFT 10 s", "--allow-mixed-slo")
    assert main([*pair, *small, "--allow-mixed-slo"]) == 0
    out, err = capsys.readouterr()
    assert "SLOs differ" in err
    slo_row = next(line for line in out.splitlines() if line.startswith("SLO: TTFT s"))
    assert "5" in slo_row and "10 (+100%)" in slo_row
    assert "SLO: TPOT" not in out                     # equal SLO parts are not shown
    assert main(["compare", "configs/same_dc_pd.yaml", "configs/pdd.yaml", *small]) == 0
    assert "SLO" not in capsys.readouterr().out.replace("SLO attainment", "")


@pytest.mark.parametrize("flags, shown", [((), True), (("--json",), False), (("--quiet",), False)])
def test_capacity_shows_progress_on_stderr_unless_quiet(config_file, monkeypatch, capsys, flags,
                                                        shown):
    """A capacity search runs the workload many times: the bar counts every run's requests."""
    from pddsim import cli
    bars = []

    class Bar:
        n = 0

        def update(self, k=1):
            self.n += k

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def spy(total, quiet):
        bars.append((quiet, Bar()))
        return bars[-1][1]
    monkeypatch.setattr(cli, "_progress", spy)
    cfg = config_file("one", (("colocated", 1),), 8)
    assert main(["capacity", str(cfg), *flags]) == 0
    (quiet, bar), = bars
    assert quiet is not shown
    runs = bar.n / 300                         # write_config's workload: 300 requests a run
    assert runs >= 3     # every run of the search counted (one stopped early: the requests it reached)


def test_compare_across_loads_starts_each_loads_own_sessions(make_config):
    """With sessions started over a horizon, each load replays its own sessions at its rate (the
    same for every system): the request rate follows the load, and at load 1.0 the first system
    runs exactly the capacity search's run at capacity."""
    from test_capacity import horizon_config
    configs = [horizon_config(make_config, 0.5, roles=(("colocated", n),), per_token=1e-4)
               for n in (1, 2)]
    cmp = compare_across_loads(configs, load_workload(configs[0]), [0.5, 1.0], seed=0)
    (half_one, half_two), (full_one, _) = cmp.summaries
    assert [p["session_rate_rps"] for p in cmp.points()] == [cmp.capacity.load / 2] * 2 + [
        cmp.capacity.load] * 2
    assert half_one["requests_total"] == half_two["requests_total"] < 0.7 * full_one["requests_total"]
    assert full_one["steady_window_start_s"] == cmp.capacity.result.summary["steady_window_start_s"]
    assert full_one["ttft_p90_s"] == cmp.capacity.result.summary["ttft_p90_s"]
