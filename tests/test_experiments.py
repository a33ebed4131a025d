"""compare, capacity and check: the commands planners and CI pipelines build on."""
import json

import pytest
import yaml

from helpers import config, write_config
from pddsim.experiments.capacity import find_capacity
from pddsim.cli import main
from pddsim.experiments.compare import compare, format_table
from pddsim.workload.synthetic import poisson_workload


def test_capacity_grows_with_instances(tmp_path):
    w = poisson_workload(300, 10, 3000, 60, seed=0)
    one = find_capacity(config(tmp_path, roles=(("colocated", 1),)), w)
    two = find_capacity(config(tmp_path, roles=(("colocated", 2),)), w)
    assert one.result.summary["slo_attainment"] >= 0.9
    assert 1.6 < two.capacity_rps / one.capacity_rps < 2.4
    assert one.capacity_rps == pytest.approx(300 / (w.requests[-1].arrival_s - w.requests[0].arrival_s)
                                             * one.time_scale)


def test_compare_runs_every_system_on_one_workload(tmp_path):
    w = poisson_workload(200, 5, 3000, 60, seed=0)
    small, big = config(tmp_path, roles=(("colocated", 1),)), config(tmp_path, roles=(("colocated", 3),))
    rows = compare([small, big], w)
    assert [r["requests_total"] for r in rows] == [200, 200]
    assert rows[1]["ttft_p90_s"] < rows[0]["ttft_p90_s"]
    table = format_table(rows)
    assert "TTFT P90 s" in table and "%)" in table      # deltas against the first


def test_compare_and_capacity_json(tmp_path, capsys):
    a = write_config(tmp_path, "one", (("colocated", 1),), 8)
    b = write_config(tmp_path, "two", (("colocated", 2),), 8)
    assert main(["compare", str(a), str(b), "--json", "--quiet"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["system"] for r in rows] == ["one", "two"]
    assert main(["capacity", str(a), "--json"]) == 0
    cap = json.loads(capsys.readouterr().out)
    assert cap["capacity_rps"] > 0 and "bcr" in cap and cap["slo_attainment"] >= 0.9


def test_check_passes_then_fails_when_a_pin_moves(tmp_path, capsys):
    cfg = write_config(tmp_path, "pinned", (("colocated", 1),), 5)
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
