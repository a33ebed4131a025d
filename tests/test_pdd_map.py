"""Where PDD wins: the two-factor map of PDD's capacity and BCR over a baseline's, and the
assumption under PDD's prefill pool (a P keeps a prompt's KV until its WAN copy has left)."""
import json

import pytest
import yaml
from test_capacity import KNOBS

from pddsim.cli import main
from pddsim.experiments.pdd_map import FACTORS, pdd_map, plot_map
from pddsim.sim import simulate

WORKLOAD = {"replay": "closed", "horizon_s": 300, "session_rate_rps": 0.3,
            "synthetic": {"kind": "agent", "knobs": {**KNOBS, "output_mean": 40}}}


def write(tmp_path, make_config, name, **kw):
    cfg = make_config(workload=WORKLOAD, slo={"ttft_s": 2.0, "tpot_s": 0.05}, **kw)
    raw = cfg.model_dump(exclude={"base_dir"}, exclude_none=True)
    raw["name"] = name
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def systems(tmp_path, make_config):
    base = write(tmp_path, make_config, "same_dc", per_token=1e-4)
    pdd = write(tmp_path, make_config, "pdd", per_token=1e-4, two_clusters=True,
                roles=(("prefill", 1), ("relay", 1), ("decode", 1)),
                clusters__b__gpu="h200", prefix_cache={"decode_tokens": None})
    return base, pdd


def test_a_reduced_map(systems, tmp_path):
    """2 x 2: the GPU B premium moves only PDD's BCR, in inverse proportion to its cost, and
    leaves both capacities as they were; the map is drawn."""
    base, pdd = systems
    rows = pdd_map(base, pdd, ("gpu_b_premium", [0.0, 1.0]), ("tpot_slo_s", [0.03, 0.05]))
    assert [(r["x"], r["y"]) for r in rows] == [(0.0, 0.03), (1.0, 0.03), (0.0, 0.05), (1.0, 0.05)]
    for cheap, dear in (rows[0:2], rows[2:4]):
        assert cheap["pdd_capacity_rps"] == dear["pdd_capacity_rps"] is not None
        assert cheap["baseline_capacity_rps"] == dear["baseline_capacity_rps"] is not None
        assert cheap["capacity_ratio"] == pytest.approx(
            cheap["pdd_capacity_rps"] / cheap["baseline_capacity_rps"])
        # PDD's GPUs: a node of 8 x GPU A for P and one for the RLD, a node of GPU B priced at
        # GPU A's price (premium 0) or twice it (premium 1): costs 3 and 4 nodes of GPU A
        a, b = 2.0, 1.0
        assert cheap["bcr_ratio"] / dear["bcr_ratio"] == pytest.approx((a + 2 * b) / (a + b),
                                                                         rel=1e-9)
    out = tmp_path / "map.png"
    plot_map(rows, "gpu_b_premium", "tpot_slo_s", out)
    assert out.stat().st_size > 0


def test_the_map_command(systems, capsys, input_error):
    base, pdd = systems
    assert main(["map", "--x", "gpu_b_premium=0,1", "--y", "wan_gbps=10", "--baseline", str(base),
                 "--pdd", str(pdd), "--json", "--quiet"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 and rows[0]["bcr_ratio"] > rows[1]["bcr_ratio"]
    code = main(["map", "--x", "hbm=80,96", "--y", "wan_gbps=10", "--baseline", str(base),
                 "--pdd", str(pdd)])
    input_error(code, capsys.readouterr().err, "hbm", "gpu_b_premium")




def test_a_prefill_instance_keeps_the_prompts_kv_until_its_wan_copy_ends(make_config, make_workload):
    """PDD is prefill-bound, so where P's KV is freed matters: the model holds it on the P from the
    prefill until the last byte of its WAN copy has left (not when the RLD copy, which is faster,
    ends), then frees it. 8K tokens of llama KV (2.7 GB) over 1 Gbps take ~21 s."""
    cfg = make_config(roles=(("prefill", 1), ("relay", 1), ("decode", 1)), two_clusters=True,
                      wan={"bandwidth_gbps": 1, "rtt_ms": 20}, pdd={"path_policy": "always_relay",
                                                                   "handoff": "one_shot"},
                      observe={"sample_s": 0.5})
    res = simulate(cfg, make_workload((0.0, 8192, 4000)))
    r = res.requests.iloc[0]
    wan_s = 8192 * 327_680 / (1e9 / 8)
    kv = res.timeseries.query("entity == 'a/prefill0' and metric == 'kv_occupancy'")
    held = kv[kv.value > 0].time_s
    assert r.pipeline == "p_rld_md" and r.ttft_s < 1          # the RLD streamed long before
    assert held.min() < 1 and held.max() == pytest.approx(wan_s, abs=1.0)
    assert (kv[(kv.time_s > 1) & (kv.time_s < wan_s - 1)].value > 0).all()
    assert (kv[kv.time_s > wan_s + 1].value == 0).all()


def test_the_cli_lists_every_factor(capsys):
    try:
        main(["map", "--help"])
    except SystemExit:
        pass
    out = capsys.readouterr().out
    assert all(name in out for name in FACTORS)
