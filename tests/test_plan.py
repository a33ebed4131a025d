"""plan: the winner is the brute-force best of the grid, pruning only skips points that cannot win,
the answer does not depend on the workers or the cache, and bad input is one line."""
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import config

from pddsim.cli import main
from pddsim.config import load_config
from pddsim.errors import InputError
from pddsim.experiments import plan as plan_module
from pddsim.experiments.backends import Processes
from pddsim.experiments.plan import best_splits, build_points, interval, measure, parse_vary, plan, split_axes
from pddsim.experiments.result_cache import ResultCache
from pddsim.sim import load_workload

P = "clusters.a.instances.0.count"
D = "clusters.a.instances.1.count"
VARY = [f"{P}=1..2", f"{D}=1..3"]


def small_config(tmp_path: Path, n_requests: int = 60) -> Path:
    """Prefill and decode in one cluster; decode batches are small, so decode is the bottleneck
    and capacity grows with decode instances."""
    raw = config(tmp_path, roles=(("prefill", 1), ("decode", 1)), per_token=2e-5).model_dump(
        exclude={"base_dir"})
    raw["batching"] = {"max_batch": 8}
    raw["workload"] = {"synthetic": {"kind": "poisson", "knobs": {
        "n_requests": n_requests, "rate_rps": 4, "input_mean": 3000, "output_mean": 100}}}
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return small_config(tmp_path_factory.mktemp("plan"))


@pytest.fixture(scope="module")
def shared_cache(small):
    """Plans of the same points share measurements (the cache changes no result: see the resume
    test), which keeps this module fast."""
    return ResultCache(small.parent / "cache")


@pytest.fixture(scope="module")
def grid(small):
    """Every point of the grid measured, no pruning."""
    rows = []
    for p in build_points(small, parse_vary(VARY)):
        cfg = p.cfg.model_copy(update={"seed": 0})
        task = (cfg, "w", 0, None, None)
        rows.append({"n": p.n, "cost": p.cost, **measure({"w": load_workload(cfg)}, task)})
    return rows


def test_parse_vary_ranges_and_lists():
    assert parse_vary(["a.count=1..3", "b=h200,h20", "c = 2..8:3"]) == {
        "a.count": [1, 2, 3], "b": ["h200", "h20"], "c": [2, 5, 8]}
    for text, message in [("a=3..1", "empty range"), ("a=", "expected KEY=V1"),
                          ("a=1..0:1", "empty range")]:
        with pytest.raises(InputError, match=message):
            parse_vary([text])
    with pytest.raises(InputError, match="given twice"):
        parse_vary(["a=1", "a=2"])


def test_interval_is_a_student_t_interval():
    assert interval([2.0]) == (2.0, None, None)
    mean, lo, hi = interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and hi - mean == pytest.approx(4.303 * 1.0 / 3 ** 0.5)
    assert interval([1.0, None]) == (None, None, None)


@pytest.mark.parametrize("objective,budget,load", [("bcr", 110, None), ("capacity", 110, None),
                                                   ("cost", None, 6.0), ("margin", 110, None)])
def test_winner_is_the_brute_force_best(small, shared_cache, grid, objective, budget, load):
    grid = [r for r in grid if budget is None or r["cost"] <= budget]
    result = plan(small, VARY, budget=budget, load=load, objective=objective, seed=0,
                  backend=Processes(1), cache=shared_cache)
    if objective == "bcr":
        best = max(grid, key=lambda r: (r["bcr_at_capacity"], -r["cost"]))
    elif objective == "capacity":
        best = max(grid, key=lambda r: (r["capacity_rps"], -r["cost"]))
    elif objective == "margin":
        best = max(grid, key=lambda r: (r["margin_at_capacity"], -r["cost"]))
    else:
        best = min((r for r in grid if r["capacity_rps"] >= load),
                   key=lambda r: (r["cost"], -r["capacity_rps"]))
    assert result.best["point"] == best["n"]
    assert result.best["capacity_rps"] == best["capacity_rps"]       # the same run, exactly
    assert result.space == 6 and result.simulated <= len(grid)
    statuses = [p["status"] for p in result.points]
    assert result.simulated == statuses.count("simulated")
    if budget is not None:
        assert statuses.count("over budget") == 6 - len(grid)
    for p in result.points:                 # nothing pruned could have beaten the winner
        if p["status"] == "pruned":
            measured = next(r for r in grid if r["n"] == p["point"])
            assert measured["n"] != best["n"]


def test_neighbour_starts_find_the_capacities_of_searches_from_scratch(small, grid):
    """Each point's search starts at its nearest measured neighbour's capacity load (after the
    first wave), on the same lattice of loads: every capacity is the one its search from the
    configured load found, run for run the same figure, in fewer runs."""
    result = plan(small, VARY, seed=0, backend=Processes(1))
    simulated = [p for p in result.points if p["status"] == "simulated"]
    scratch = {r["n"]: r for r in grid}
    assert len(simulated) == 6
    for p in simulated:
        assert p["capacity_rps"] == scratch[p["point"]]["capacity_rps"]
    assert sum(p["capacity_runs"] for p in simulated) < sum(r["runs"] for r in grid)


def test_pruning_uses_monotone_capacity(small, shared_cache):
    """A measured point that misses the load bounds every point with fewer instances: those are
    pruned unrun, and the count says so."""
    result = plan(small, [f"{P}=1..3", f"{D}=1..3"], load=40.0, seed=0, backend=Processes(1),
                  cache=shared_cache)
    pruned = [p for p in result.points if p["status"] == "pruned"]
    assert pruned and result.simulated + len(pruned) == result.space
    assert all(p["capacity_rps"] is None and "< load" in p["reason"] for p in pruned)
    assert result.best is not None and result.best["capacity_rps"] >= 40


def test_workers_and_seeds_change_nothing(small):
    vary = [f"{D}=1..2"]
    one = plan(small, vary, seeds=2, seed=0, backend=Processes(1))
    with Processes(2) as two_workers:
        two = plan(small, vary, seeds=2, seed=0, backend=two_workers)
    assert one.to_json() == two.to_json()
    best = one.best
    assert best["capacity_lo"] <= best["capacity_rps"] <= best["capacity_hi"]
    assert one.distinguishable in (True, False)


def test_winner_only_ends_the_searches_that_cannot_win(small):
    """Asked only for the winner, a point's search ends at its first failure at or below the best
    capacity load measured before it: the same winner, its capacity from a whole search, in fewer
    runs; a beaten point's capacity is in truth below the winner's; the plan is the same with
    idle workers measuring ahead."""
    vary = [f"{P}=1..3", f"{D}=1..3"]
    whole = plan(small, vary, objective="capacity", seed=0, backend=Processes(1))
    quick = plan(small, vary, objective="capacity", seed=0, backend=Processes(1), winner_only=True)
    assert quick.best["point"] == whole.best["point"]
    assert quick.best["capacity_rps"] == whole.best["capacity_rps"]
    beaten = [p for p in quick.points if p["status"] == "beaten"]
    assert beaten and all(p["outcome"] == "beaten" and p["capacity_rps"] is None for p in beaten)
    full = {p["point"]: p for p in whole.points}
    for p in beaten:                        # measured whole, or pruned there as unable to win
        assert (full[p["point"]]["capacity_rps"] or 0) < whole.best["capacity_rps"]

    def runs(result):
        return sum(p["capacity_runs"] or 0 for p in result.points)
    assert runs(quick) < runs(whole)
    assert plan(small, vary, objective="capacity", seed=0, backend=Slots(3),
                winner_only=True).to_json() == quick.to_json()
    # other objectives and several seeds keep whole searches
    assert plan(small, [f"{D}=1..2"], seeds=2, seed=0, backend=Processes(1),
                objective="capacity", winner_only=True).to_json() == plan(
        small, [f"{D}=1..2"], seeds=2, seed=0, backend=Processes(1), objective="capacity").to_json()


def test_winner_only_measures_first_the_points_nearest_the_configured_split(small):
    """Asked for the winner within a budget of 4 instances, the plan measures first the two splits
    nearest the configured 3P + 1D, alone, then gives the rest the best so far to beat: the same
    winner as the whole plan's, and the same plan with a third worker measuring ahead."""
    vary = [f"{P}=1..3", f"{D}=1..3"]
    budget = 4 * 21.52 + 0.01
    whole = plan(small, vary, [f"{P}=3"], budget=budget, objective="capacity", seed=0,
                 backend=Processes(1))
    slots = Slots(1)
    quick = plan(small, vary, [f"{P}=3"], budget=budget, objective="capacity", seed=0,
                 backend=slots, winner_only=True)
    assert quick.best["values"] == whole.best["values"]
    assert quick.best["capacity_rps"] == whole.best["capacity_rps"]
    first, *later = slots.tasks
    assert [split for split, _ in first] == [(3, 1), (2, 2)]
    assert all(beat is None for _, beat in first) and all(beat for _, beat in later[0])
    assert plan(small, vary, [f"{P}=3"], budget=budget, objective="capacity", seed=0,
                backend=Slots(3), winner_only=True).to_json() == quick.to_json()


class Slots:
    """A backend with `workers` slots that runs each batch here, in order."""

    def __init__(self, workers: int):
        self.workers, self.batches, self.tasks = workers, [], []

    def map(self, fn, items, shared=None, on_done=None):
        self.batches.append(len(items))
        self.tasks.append([(tuple(g.count for g in cfg.clusters["a"].instances), beat)
                           for cfg, _, _, _, beat in items])
        results = [fn(shared, item) for item in items]
        for i, value in enumerate(results):
            if on_done is not None:
                on_done(i, value)
        return results


def test_idle_workers_measure_ahead_without_changing_the_plan(small):
    """Workers a wave leaves idle measure the next wave's points ahead, so more runs happen than
    points count as simulated; yet the plan (which points are simulated or pruned, every
    number) and its progress are the ones a single worker gives."""
    vary = [f"{P}=1..3", f"{D}=1..3"]
    ticks = {1: 0, 3: 0}

    def tick(workers):
        return lambda n: ticks.__setitem__(workers, ticks[workers] + n)

    one = plan(small, vary, load=40.0, seed=0, backend=Processes(1), on_progress=tick(1))
    slots = Slots(3)
    three = plan(small, vary, load=40.0, seed=0, backend=slots, on_progress=tick(3))
    assert three.to_json() == one.to_json() and ticks[3] == ticks[1]
    assert any(p["status"] == "pruned" for p in one.points)
    assert sum(slots.batches) > one.simulated
    assert max(slots.batches) % 3 == 0
    # what was measured ahead and not used is counted, apart from the plan's own runs
    assert one.unused_runs == 0 and three.runs == one.runs


def test_cli_json_table_and_out(small, shared_cache, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["plan", str(small), *(f"--vary={v}" for v in VARY), "--budget", "110", "--jobs", "1",
            "--quiet", "--seed", "0", "--cache", str(shared_cache.dir)]
    assert main([*args, "--json", "--out", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"best", "pareto", "points", "simulated", "space", "runs"} <= set(doc)
    assert doc["space"] == len(doc["points"]) == 6
    assert doc["runs"] == sum(p["capacity_runs"] or 0 for p in doc["points"]) >= doc["simulated"]
    for p in doc["points"]:
        assert set(p["values"]) == {P, D}
        assert {"capacity_rps", "cost_per_hour", "bcr_at_capacity"} <= set(p)
    costs = [p["cost_per_hour"] for p in doc["pareto"]]
    caps = [p["capacity_rps"] for p in doc["pareto"]]
    assert costs == sorted(costs) and caps == sorted(caps) and doc["best"]["point"]
    table = pd.read_parquet(out / "points.parquet")
    assert len(table) == 6 and {P, D, "capacity_rps", "rank", "pareto"} <= set(table.columns)
    assert (out / "heatmap.png").stat().st_size > 0 and (out / "pareto.png").stat().st_size > 0
    written = json.loads((out / "provenance.json").read_text())       # what produced the plan
    assert written["vary"] == VARY and written["budget"] == 110 and written["config"]["name"] == "t"
    assert {k: v for k, v in written.items() if k != "run_info"} == {
        k: v for k, v in doc["provenance"].items() if k != "run_info"}
    page = tmp_path / "plan.html"                 # the report reads a plan's output too
    assert main(["report", str(out), "-o", str(page)]) == 0
    html = page.read_text()
    assert "points" in html and "\"type\": \"heatmap\"" in html and "Pareto front" in html
    assert "What produced it" in html and doc["provenance"]["config_sha256"][:12] in html
    capsys.readouterr()
    assert main(args) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"simulated {doc['simulated']} of 6 points")
    assert f"{doc['runs']} simulations" in text.splitlines()[0]
    assert f"best: point {doc['best']['point']} " in text and "Pareto front" in text


def test_bad_input_is_one_line(small, capsys, input_error):
    base = ["plan", str(small), "--quiet", "--jobs", "1"]
    cases = [
        (["--vary", "clusters.a.nope=1..2"], ["clusters.a.nope"]),
        (["--vary", f"{P}=3..1"], ["empty range"]),
        (["--vary", f"{P}=1..2", "--budget", "1"], ["--budget 1", "below every point"]),
        (["--vary", f"{P}=1..2", "--objective", "cost"], ["needs --load"]),
        (["--vary", f"{P}=1..2", "--backend", "ray", "--address", "127.0.0.1:9"],
         ["--address 127.0.0.1:9", "no Ray cluster reachable"]),
    ]
    for extra, fragments in cases:
        input_error(main([*base, *extra]), capsys.readouterr().err, *fragments)


def test_cache_resumes_a_killed_plan_with_only_the_missing_runs(tmp_path):
    path = small_config(tmp_path)
    cache = tmp_path / "cache"
    args = ["plan", str(path), "--vary", f"{D}=1..4", "--jobs", "1", "--quiet", "--seed", "0",
            "--cache", str(cache), "--json"]
    # the plan is killed (SIGKILL, nothing cleans up) right after it has kept its first run
    killed_after_first_run = (
        "import os, signal, sys\n"
        "from pddsim.experiments.result_cache import ResultCache\n"
        "from pddsim.cli import main\n"
        "put = ResultCache.put\n"
        "def put_then_die(self, key, value):\n"
        "    put(self, key, value)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "ResultCache.put = put_then_die\n"
        "main(sys.argv[1:])\n")
    child = subprocess.run([sys.executable, "-c", killed_after_first_run, *args],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    assert child.returncode == -signal.SIGKILL
    finished = len(list(cache.glob("*.json")))
    assert finished == 1 and not list(cache.glob("*.tmp"))

    ran = []
    real = plan_module.measure

    def counting(workloads, task):
        ran.append(task[0].clusters["a"].instances[1].count)
        return real(workloads, task)

    mp = pytest.MonkeyPatch()              # resumed in this process, so its runs can be counted
    mp.setattr(plan_module, "measure", counting)
    try:
        resumed = plan(path, [f"{D}=1..4"], seed=0, backend=Processes(1), cache=ResultCache(cache))
    finally:
        mp.undo()
    assert resumed.cached == finished and len(ran) == resumed.simulated - finished > 0
    fresh = plan(path, [f"{D}=1..4"], seed=0, backend=Processes(1))

    def strip(doc):
        return {k: v for k, v in doc.items() if k != "cached"}

    assert strip(resumed.to_json()) == strip(fresh.to_json())


def test_cache_key_follows_config_seed_and_workload(small):
    cfg = load_config(small)
    workload = load_workload(cfg)
    from pddsim.experiments.result_cache import workload_digest
    digest = workload_digest(workload)
    key = ResultCache.key("t", cfg, digest, 0)
    assert key == ResultCache.key("t", load_config(small), digest, 0)
    assert key != ResultCache.key("t", cfg, digest, 1)
    assert key != ResultCache.key("t", load_config(small, ["slo.ttft_s=2"]), digest, 0)
    assert key != ResultCache.key("t", cfg, workload_digest(load_workload(
        load_config(small, ["seed=5"]))), 0)


def colocated_of(small: Path) -> Path:
    """`small`'s deployment as colocated instances, its workload the same."""
    raw = yaml.safe_load(small.read_text())
    raw["name"] = "colocated"
    raw["clusters"]["a"]["instances"] = [{"role": "colocated", "count": 1, "tp": 8}]
    colocated = small.parent / "colocated.yaml"
    colocated.write_text(yaml.safe_dump(raw))
    return colocated


def test_best_splits_runs_the_systems_side_by_side_as_one_by_one(small):
    """The systems' plans share the backend's batches (a wave of each), and each plan is the one
    it is alone."""
    colocated = colocated_of(small)
    slots = Slots(2)
    chosen = best_splits([small, colocated], budget=90.0, seed=0, backend=slots)
    assert any({len(split) for split, _ in batch} == {1, 2} for batch in slots.tasks)
    for path, (_, together) in zip([small, colocated], chosen):
        alone = plan(path, split_axes(load_config(path), 90.0), budget=90.0, objective="capacity",
                     seed=0, backend=Slots(2), winner_only=True)
        assert together.to_json() == alone.to_json()


def test_best_split_compare_plans_each_system_within_one_budget(small, shared_cache, capsys,
                                                                input_error):
    colocated = colocated_of(small)
    budget = 90.0          # an instance costs $21.52/h
    assert split_axes(load_config(small), budget) == [f"{P}=1..3", f"{D}=1..3"]
    assert split_axes(load_config(colocated), budget) == [f"{P}=1..4"]
    args = ["compare", str(small), str(colocated), "--best-split", "--budget", str(budget),
            "--jobs", "1", "--quiet", "--seed", "0", "--cache", str(shared_cache.dir)]
    assert main([*args, "--json"]) == 0
    summaries = json.loads(capsys.readouterr().out)
    for path, summary, letters in [(small, summaries[0], "PD"), (colocated, summaries[1], "C")]:
        vary = split_axes(load_config(path), budget)
        best = plan(path, vary, budget=budget, objective="capacity", seed=0, backend=Processes(1),
                    cache=shared_cache).best
        counts = [best["values"][v.split("=")[0]] for v in vary]
        assert summary["split"] == " + ".join(f"{n}{x}" for n, x in zip(counts, letters))
        assert summary["cost_per_hour"] <= budget
        assert summary["capacity_rps"] == best["capacity_rps"]
        assert summary["best_split"]["values"] == best["values"]
        assert summary["best_split"]["runs"] >= summary["best_split"]["simulated"] > 0
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "within $90/h" in text and summaries[0]["split"] in text
    assert f"{summaries[0]['best_split']['runs']} simulations" in text
    input_error(main(["compare", str(small), "--best-split", "--no-capacity"]),
                       capsys.readouterr().err, "--no-capacity")


def test_the_pinned_paper_figures_are_at_the_planned_splits():
    """The golden figures of the reduced paper scenario pin each system at its planned split, so
    a plan that moves a split moves the pins with it."""
    from pddsim.config import bundled
    from pddsim.experiments.paper import PLANNED_SPLITS
    planned = yaml.safe_load(PLANNED_SPLITS.read_text())["splits"]
    golden = yaml.safe_load(bundled("golden/paper_small.yaml").read_text())["scenarios"]
    assert {Path(s["config"]).name for s in golden} == set(planned)
    for scenario in golden:
        counts = dict(item.split("=") for item in scenario["set"] if ".count=" in item)
        assert {k: int(v) for k, v in counts.items()} == planned[Path(scenario["config"]).name]


def test_the_paper_comparison_runs_at_the_planned_splits(tmp_path, capsys, input_error):
    """The paper scenario's default comparison is the fair one: each system at the split that
    `compare --best-split` found within one budget (shipped: planning it takes minutes), each
    within that budget, the budget being what `--best-split` plans within by default."""
    from pddsim.cost import cost_per_hour
    from pddsim.experiments.paper import PAPER_CONFIGS, PLANNED_SPLITS, planned_configs
    configs, budget = planned_configs()
    assert budget == cost_per_hour(load_config(PAPER_CONFIGS[0]))
    planned = yaml.safe_load(PLANNED_SPLITS.read_text())["splits"]
    for path, cfg in zip(PAPER_CONFIGS, configs):
        assert cost_per_hour(cfg) <= budget
        raw = cfg.model_dump()
        for key, count in planned[path.name].items():
            _, cluster, _, group, _ = key.split(".")
            assert raw["clusters"][cluster]["instances"][int(group)]["count"] == count
    # a count set by hand wins over the planned one
    mine = planned_configs([f"{P}=1"])[0][0]
    assert mine.clusters["a"].instances[0].count == 1
    reduced = ["--set", "workload.horizon_s=30", "--no-capacity", "--quiet"]
    assert main(["compare", *reduced]) == 0
    out = capsys.readouterr().out
    assert f"each system at its best split within ${budget:g}/h" in out
    assert main(["compare", *reduced, "--json"]) == 0
    summaries = json.loads(capsys.readouterr().out)
    assert main(["compare", *reduced, "--configured-split", "--json"]) == 0
    configured = json.loads(capsys.readouterr().out)
    from pddsim.experiments.compare import split_label
    assert [s["split"] for s in summaries] == [split_label(c) for c in configs]
    assert [s["split"] for s in configured] == [split_label(load_config(p)) for p in PAPER_CONFIGS]
    input_error(main(["compare", str(PAPER_CONFIGS[0]), "--configured-split"]),
                capsys.readouterr().err, "--configured-split")
    # a planned-splits file that lacks a system or is over budget is one line naming it
    bad = tmp_path / "plan.yaml"
    for text, says in [("budget_per_hour: 176\nsplits: {}\n", "no split for same_dc_pd.yaml"),
                       ("budget_per_hour: 1\nsplits: {same_dc_pd.yaml: {}}\n", "over the budget"),
                       ("budget: 1\nsplits: {}\n", "budget")]:
        bad.write_text(text)
        with pytest.raises(InputError, match=says) as e:
            planned_configs(path=bad)
        assert str(bad) in str(e.value)


def test_every_point_has_its_outcome_in_the_table_json_and_heatmap():
    """A point whose capacity search never broke the SLO is a lower bound (with the rate it
    reached), not a blank 'simulated'; pruned, over-budget, failed and unfit points say so."""
    from pddsim.experiments.plan import Plan, Point, format_plan, heatmap_cells
    found = {"capacity_rps": 2.0, "bcr_at_capacity": 5.0, "margin_at_capacity": 1.0,
             "bottleneck": "p"}
    not_found = {"capacity_rps": None, "bcr_at_capacity": None, "margin_at_capacity": None,
                 "bottleneck": None, "capacity_lower_bound_rps": 3.5}
    specs = [("simulated", [found]), ("simulated", [not_found]), ("pruned", []),
             ("over budget", []), ("failed", []), ("infeasible", [])]
    points = [Point(n, {P: 1 + (n - 1) % 3, D: 1 + (n - 1) // 3}, None, 10.0 * n, status,
                    f"why {n}" if status != "simulated" else "", samples)
              for n, (status, samples) in enumerate(specs, 1)]
    rows = [p.row() for p in points]
    assert [r["outcome"] for r in rows] == ["capacity", "lower bound only", "pruned", "over budget",
                                            "failed", "not a deployment"]
    assert rows[1]["capacity_lower_bound_rps"] == 3.5 and "3.5 rps" in rows[1]["reason"]
    assert rows[0]["capacity_lower_bound_rps"] is None
    # two seeds, one found: a lower bound, the least rate either reached
    mixed = Point(7, {}, None, 1.0, "simulated", "", [found, not_found]).row()
    assert mixed["outcome"] == "lower bound only" and mixed["capacity_lower_bound_rps"] == 2.0
    axes = {P: [1, 2, 3], D: [1, 2]}
    result = Plan(axes, "bcr", None, None, [0], rows, [1], [1], 2, 0)
    table = format_plan(result)
    assert "1 capacity, 1 lower bound only" in table.splitlines()[0]
    assert ">= 3.500" in table and "the capacity is higher" in table
    x, y, grid, text = heatmap_cells(result.points, axes)
    assert (x, y) == (P, D)
    assert text == [["5.0", ">= 3.5 rps", "pruned"], ["over budget", "failed", "not a deployment"]]
    assert grid[0, 0] == 5.0 and np.isnan(grid[0, 1])
    frame = result.frame()
    assert list(frame["outcome"]) == [r["outcome"] for r in rows]


def test_measure_keeps_the_lower_bound_when_the_slo_never_breaks(make_config):
    from test_experiments import CLOSED, agents
    cfg = make_config(roles=(("colocated", 2),), workload=CLOSED)
    got = measure({"w": agents(4)}, (cfg, "w", 0, None, None))
    assert got["capacity_rps"] is None and got["capacity_lower_bound_rps"] > 0
