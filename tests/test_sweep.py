"""sweep: grid parsing, one row per point in grid order, one shared workload, and a table that does
not depend on how many processes ran it."""
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pddsim.cli import main
from pddsim.errors import InputError
from pddsim.experiments import sweep as sweep_module
from pddsim.experiments.backends import Processes
from pddsim.experiments.sweep import grid_points, sweep

GRID = ["clusters.a.instances.0.count=1,2", "slo.ttft_s=0.05,1"]
KEYS = ["clusters.a.instances.0.count", "slo.ttft_s"]


@pytest.fixture
def tiny(config_file):
    return config_file("tiny", (("colocated", 1),), 8)


def test_grid_points_are_the_product_last_grid_fastest():
    assert grid_points(["a=1,2", "b.c=x,y"]) == [
        {"a": 1, "b.c": "x"}, {"a": 1, "b.c": "y"}, {"a": 2, "b.c": "x"}, {"a": 2, "b.c": "y"}]
    assert grid_points([]) == [{}]


def test_grid_values_parse_as_yaml():
    points = grid_points(["k = 0.5, null, one_shot, '3', [1, 2], {h200: 4.5}"])
    assert [p["k"] for p in points] == [0.5, None, "one_shot", "3", [1, 2], {"h200": 4.5}]


@pytest.mark.parametrize("text", ["count", "=1,2", "k=", "k=1,,2", "k=[1,2"])
def test_a_malformed_grid_is_an_input_error(text):
    with pytest.raises(InputError, match="expected KEY=V1,V2"):
        grid_points([text])


def test_a_key_given_twice_is_an_input_error():
    with pytest.raises(InputError, match="given twice"):
        grid_points(["a=1", "a=2"])


def test_two_by_two_sweep_rows_in_grid_order(tiny):
    table = sweep(tiny, GRID, backend=Processes(1))
    assert list(table.columns[:3]) == KEYS + ["system"]
    assert table[KEYS].values.tolist() == [[1, 0.05], [1, 1.0], [2, 0.05], [2, 1.0]]
    assert (table["requests_total"] == 300).all() and "wall_s" not in table
    one, two = table.iloc[0], table.iloc[2]
    assert two["ttft_p50_s"] < one["ttft_p50_s"] and two["ttft_p90_s"] < one["ttft_p90_s"]
    assert two["cost_per_hour"] == 2 * one["cost_per_hour"]
    assert table.iloc[0]["slo_attainment"] < table.iloc[1]["slo_attainment"]   # tighter TTFT SLO


def test_workers_do_not_change_the_table(tiny):
    with Processes(2) as two_workers:
        two = sweep(tiny, GRID, backend=two_workers)
    pd.testing.assert_frame_equal(two, sweep(tiny, GRID, backend=Processes(1)), check_exact=True)


def test_one_workload_unless_the_grid_varies_it(tiny, monkeypatch):
    calls = []

    def counting(cfg):
        calls.append(cfg.workload.synthetic.knobs.n_requests)
        return load(cfg)

    load = sweep_module.load_workload
    monkeypatch.setattr(sweep_module, "load_workload", counting)
    sweep(tiny, GRID, backend=Processes(1))
    assert calls == [300]
    calls.clear()
    table = sweep(tiny, ["workload.synthetic.knobs.n_requests=50,100"], backend=Processes(1))
    assert calls == [50, 100] and table["requests_total"].tolist() == [50, 100]


def test_a_bad_point_fails_before_anything_runs(input_error, tiny, monkeypatch, capsys):
    def no_run(*args, **kwargs):
        raise AssertionError("ran a point")

    monkeypatch.setattr(sweep_module, "compare", no_run)
    code = main(["sweep", str(tiny), "--grid", "clusters.a.nope=1", "--jobs", "1", "--quiet"])
    input_error(code, capsys.readouterr().err, "grid point 1", "clusters.a.nope")
    code = main(["sweep", str(tiny), "--grid", "clusters.a.instances.0.count=1,0", "--quiet"])
    input_error(code, capsys.readouterr().err, "grid point 2",
                       "clusters.a.instances.0.count=0", "greater than or equal to 1")


@pytest.mark.parametrize("name", ["x.csv", "x.parquet"])
def test_out_writes_the_whole_table(tiny, tmp_path, capsys, name):
    out = tmp_path / name
    assert main(["sweep", str(tiny), *(f"--grid={g}" for g in GRID), "--jobs", "1", "--quiet",
                 "--out", str(out), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    written = pd.read_csv(out) if name.endswith(".csv") else pd.read_parquet(out)
    assert len(rows) == len(written) == 4
    assert list(written.columns) == list(rows[0])
    assert written[KEYS].values.tolist() == [[r[k] for k in KEYS] for r in rows]
    assert written["ttft_p90_s"].tolist() == [r["ttft_p90_s"] for r in rows]
    made_by = json.loads(Path(f"{out}.provenance.json").read_text())      # what produced it
    assert made_by["grid"] == GRID and made_by["config"]["name"] == yaml.safe_load(tiny.read_text())["name"]


def test_table_and_unknown_extension(input_error, tiny, capsys):
    assert main(["sweep", str(tiny), "--grid", GRID[0], "--jobs", "1", "--quiet"]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split() == [KEYS[0], "ttft_p50_s", "ttft_p90_s", "tpot_mean_s", "slo_attainment",
                              "goodput_rps", "cost_per_hour", "bcr"]
    assert len(lines) == 2
    code = main(["sweep", str(tiny), "--grid", GRID[0], "--out", "x.txt"])
    input_error(code, capsys.readouterr().err, "--out x.txt", ".csv or .parquet")
