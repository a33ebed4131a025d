"""Where PDD wins: the two-factor map of PDD's capacity and BCR over a baseline's, each system at
its best split for its cost (a local search from the given one) or at the given split, its hardware
and model factors (catalog edits whose KV pool follows), its searches run in parallel or from a
cache with the same map, and the assumption under PDD's prefill pool (a P keeps a prompt's KV until
its WAN copy has left)."""
import json
from pathlib import Path

import pytest
import yaml
from test_capacity import KNOBS

from pddsim import catalog
from pddsim.cli import main
from pddsim.cost import cost_per_hour
from pddsim.errors import InputError
from pddsim.experiments import paper
from pddsim.experiments import pdd_map as map_module
from pddsim.experiments.backends import Processes
from pddsim.experiments.capacity import find_capacity
from pddsim.experiments.pdd_map import FACTORS, format_map, pdd_map, plot_map, point_config
from pddsim.experiments.plan import neighbour_splits
from pddsim.experiments.result_cache import ResultCache
from pddsim.sim import load_workload, simulate
from pddsim.system.deployment import kv_capacity_tokens

WORKLOAD = {"replay": "closed", "horizon_s": 300, "session_rate_rps": 0.3,
            "synthetic": {"kind": "agent", "knobs": {**KNOBS, "output_mean": 40}}}


def write(tmp_path, make_config, name, **kw):
    cfg = make_config(workload=WORKLOAD, slo={"ttft_s": 2.0, "tpot_s": 0.05}, **kw)
    raw = cfg.model_dump(exclude={"base_dir"}, exclude_none=True)
    raw["name"] = name
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def two_systems(tmp_path, make_config):
    """Same-DC PD and PDD (its decoders on H200) config files, small enough for a map in seconds."""
    base = write(tmp_path, make_config, "same_dc", per_token=1e-4)
    pdd = write(tmp_path, make_config, "pdd", per_token=1e-4, two_clusters=True,
                roles=(("prefill", 1), ("relay", 1), ("decode", 1)),
                clusters__b__gpu="h200", prefix_cache={"decode_tokens": None})
    return base, pdd


@pytest.fixture
def systems(tmp_path, make_config):
    return two_systems(tmp_path, make_config)


@pytest.fixture
def decode_bound(tmp_path, make_config):
    """The baseline's decoder on 2 x GPU A: llama-3.1-70b's 141 GB of weights leave 3 GB of KV
    at 80 GB a GPU, so its KV pool is what binds."""
    base = write(tmp_path, make_config, "same_dc", per_token=1e-4,
                 roles=(("prefill", 1), ("decode", 1, 2)))
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
    for bad, named in (("gpu_a_hbm_gb=-8", "hbm_gb"), ("model=gpt-9", "gpt-9"),
                       ("gpu_b_premium=dear", "gpu_b_premium=dear")):
        code = main(["map", "--x", bad, "--y", "wan_gbps=10", "--baseline", str(base),
                     "--pdd", str(pdd), "--quiet"])
        input_error(code, capsys.readouterr().err, "map point", named)


def decode_pool(cfg) -> int:
    group = next(g for g in cfg.clusters["a"].instances if g.role == "decode")
    return kv_capacity_tokens(cfg, cfg.served_model(), cfg.catalog.gpu(cfg.clusters["a"].gpu),
                              group, cfg.engine_profile(), "decode")


def test_more_hbm_on_gpu_a_is_a_larger_kv_pool_and_never_less_capacity(decode_bound):
    """GPU A's entry is edited under its own name on cluster A only (GPU B keeps its 141 GB); the
    decoder's KV pool grows by the HBM added less the engine's share of it, and the decode-bound
    baseline's capacity does not fall (it rises), while PDD's decoders are on GPU B."""
    base, pdd = decode_bound
    cfgs = {h: point_config(base, [], {"gpu_a_hbm_gb": h}, False) for h in (82, 90, 100)}
    pools = [decode_pool(cfg) for cfg in cfgs.values()]
    assert pools[0] < pools[1] < pools[2]
    util, kv = 0.9, cfgs[82].served_model().kv_bytes_per_token
    assert pools[2] - pools[1] == pytest.approx(2 * 10e9 * util / kv, abs=2 * 16)   # tp 2, block 16
    pdd_cfg = point_config(pdd, [], {"gpu_a_hbm_gb": 90}, True)
    assert pdd_cfg.catalog.gpu("h100-sxm").hbm_gb == 90 and pdd_cfg.clusters["b"].gpu == "h200"
    assert pdd_cfg.catalog.gpu("h200").hbm_gb == 141
    rows = pdd_map(base, pdd, ("gpu_a_hbm_gb", [82, 90]), ("tpot_slo_s", [0.05]))
    low, high = (r["baseline_capacity_rps"] for r in rows)
    assert low is not None and high > low * 1.1


def test_kv_bytes_per_token_and_the_model(decode_bound):
    """The KV bytes per token edit the model the point runs (after the `model` factor), and the
    KV pool is inversely proportional to them (up to a block)."""
    base, _ = decode_bound
    for model in ("llama-3.1-70b", "llama-3.3-70b-fp8"):
        half, full = (point_config(base, [], {"model": model, "kv_bytes_per_token": b}, False)
                      for b in (163_840, 327_680))
        assert half.model == full.model == model
        assert half.served_model().kv_bytes_per_token == 163_840
        assert decode_pool(half) == pytest.approx(2 * decode_pool(full), abs=16)


def test_a_gpu_both_clusters_run_gets_a_copy_for_cluster_a(tmp_path, make_config):
    """GPU A from the config's own catalog (an included file) and run by both clusters: cluster A
    gets a copy under a derived name at the original's price, cluster B keeps the original."""
    mine = {**catalog.BUNDLED.gpu("h100-sxm").model_dump(exclude={"name"}), "price_per_hour": 3.0}
    (tmp_path / "hw.yaml").write_text(yaml.safe_dump({"gpus": {"my-gpu": mine}}))
    path = write(tmp_path, make_config, "pdd", two_clusters=True,
                 roles=(("prefill", 1), ("relay", 1), ("decode", 1)), gpu_prices={"my-gpu": 2.5})
    raw = yaml.safe_load(path.read_text())
    raw["catalog"] = {"include": ["hw.yaml"]}
    for cluster in raw["clusters"].values():
        cluster["gpu"] = "my-gpu"
    path.write_text(yaml.safe_dump(raw))
    cfg = point_config(path, [], {"gpu_a_hbm_gb": 96}, True)
    assert cfg.clusters["a"].gpu == "my-gpu-96gb" and cfg.clusters["b"].gpu == "my-gpu"
    assert cfg.catalog.gpu("my-gpu-96gb").hbm_gb == 96 and cfg.catalog.gpu("my-gpu").hbm_gb == 80
    assert cfg.gpu_prices == {"my-gpu": 2.5, "my-gpu-96gb": 2.5}


def test_the_same_map_whatever_the_workers_and_from_the_cache(systems, tmp_path, capsys,
                                                              monkeypatch):
    """Two workers give the one worker's map exactly; a rerun on the cache runs no search."""
    base, pdd = systems
    argv = ["map", "--x", "gpu_b_premium=0,1", "--y", "kv_bytes_per_token=163840",
            "--baseline", str(base), "--pdd", str(pdd), "--json", "--quiet"]
    maps = []
    for extra in (["--jobs", "1"], ["--jobs", "2", "--cache", str(tmp_path / "c")]):
        assert main(argv + extra) == 0
        maps.append(capsys.readouterr().out)
    assert maps[0] == maps[1]
    rows = json.loads(maps[0])
    assert all(r["baseline_capacity_rps"] and r["pdd_capacity_rps"] for r in rows)

    def no_search(*args, **kw):
        raise AssertionError("searched again")
    monkeypatch.setattr(map_module, "find_capacity", no_search)
    assert main(argv + ["--jobs", "1", "--cache", str(tmp_path / "c")]) == 0
    assert capsys.readouterr().out == maps[0]
    with Processes(1) as backend:
        failed = pdd_map(base, pdd, ("gpu_b_premium", [0.3]), ("wan_gbps", [10]), backend=backend)
    assert failed[0]["pdd_status"].startswith("failed (AssertionError: searched again")
    assert failed[0]["capacity_ratio"] is None


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


def test_the_cli_and_the_docs_list_every_factor(capsys):
    try:
        main(["map", "--help"])
    except SystemExit:
        pass
    out = capsys.readouterr().out
    assert all(name in out for name in FACTORS)
    docs = (Path(__file__).parents[1] / "docs" / "cli.md").read_text()
    assert all(f"| `{name}` |" in docs for name in FACTORS)


def test_each_system_takes_its_own_split(tmp_path, make_config):
    """`own` (the CLI: the paper plan's splits) reaches its system only: a split the baseline
    cannot take is named as the baseline's, and the PDD config is not touched by it."""
    base, pdd = two_systems(tmp_path, make_config)
    with pytest.raises(InputError, match="baseline"):
        pdd_map(base, pdd, ("output_mean", [40]), ("tpot_slo_s", [0.05]),
                own=(["clusters.a.instances.9.count=1"], []))
    with pytest.raises(InputError, match="PDD"):
        pdd_map(base, pdd, ("output_mean", [40]), ("tpot_slo_s", [0.05]),
                own=([], ["clusters.a.instances.9.count=1"]))


def test_the_paper_systems_default_to_their_planned_splits():
    planned = yaml.safe_load(paper.PLANNED_SPLITS.read_text())["splits"]
    for path in (paper.PAPER_CONFIGS[0], paper.PAPER_CONFIGS[2]):
        assert paper.planned_counts(path) == [f"{k}={v}" for k, v in planned[path.name].items()]


def starved_systems(tmp_path, make_config):
    """Both systems given too few prefill instances (1 P + 4 D; 1 P + 3 RLD | 1 MD), slow enough
    (3e-4 s a token) that a capacity search takes a second or two on the short horizon of
    `SHORT`, whose batch cap of 2 makes decode bind too: each best split for its cost is inside
    the range (2 P + 3 D; 2 P + 2 RLD | 1 MD), one move up or down costs capacity."""
    base = write(tmp_path, make_config, "same_dc", per_token=3e-4,
                 roles=(("prefill", 1), ("decode", 4)))
    pdd = write(tmp_path, make_config, "pdd", per_token=3e-4, two_clusters=True,
                roles=(("prefill", 1), ("relay", 3), ("decode", 1)),
                clusters__b__gpu="h200", prefix_cache={"decode_tokens": None})
    return base, pdd


SHORT = ["workload.horizon_s=150", "workload.synthetic.knobs.output_mean=200", "batching.max_batch=2"]
POINT = {"tpot_slo_s": 0.05, "wan_gbps": 10}
GIVEN = {"baseline": {"clusters.a.instances.0.count": 1, "clusters.a.instances.1.count": 4},
         "pdd": {"clusters.a.instances.0.count": 1, "clusters.a.instances.1.count": 3,
                 "clusters.b.instances.0.count": 1}}


def test_each_system_climbs_to_a_split_no_neighbour_beats_at_the_same_cost(tmp_path, make_config):
    """Fixed: the given splits, one search each. Searched: each system ends on a split none of
    whose same-cost neighbours (one P <-> D, P <-> RLD move; measured here from scratch) has more
    capacity, at the cost it started from, PDD's MD untouched; the given split's search is the
    fixed map's (from the cache)."""
    base, pdd = starved_systems(tmp_path, make_config)
    grid = (("tpot_slo_s", [0.05]), ("wan_gbps", [10]))
    cache = ResultCache(tmp_path / "c")
    fixed, = pdd_map(base, pdd, *grid, SHORT, fixed_split=True, cache=cache)
    for s in ("baseline", "pdd"):
        assert fixed[f"{s}_split"] == GIVEN[s] and fixed[f"{s}_tried"] == 1
    searched, = pdd_map(base, pdd, *grid, SHORT, cache=cache)
    for s, path in (("baseline", base), ("pdd", pdd)):
        split, capacity = searched[f"{s}_split"], searched[f"{s}_capacity_rps"]
        assert split != GIVEN[s] and capacity > fixed[f"{s}_capacity_rps"]
        start = point_config(path, SHORT, POINT, s == "pdd")
        found = point_config(path, SHORT, POINT, s == "pdd", split)
        assert cost_per_hour(found) == cost_per_hour(start)
        near = neighbour_splits(found)
        assert len(near) == 2                     # inside the range: a move each way
        assert searched[f"{s}_tried"] == 3        # the start, the optimum and the other side
        for other in near:
            cfg = point_config(path, SHORT, POINT, s == "pdd", other)
            assert cost_per_hour(cfg) == cost_per_hour(start)
            assert find_capacity(cfg, load_workload(cfg)).capacity_rps <= capacity, (s, other)
    assert searched["pdd_split"]["clusters.b.instances.0.count"] == 1
    text = format_map([searched], "tpot_slo_s", "wan_gbps")
    assert "2+3 | 2+2+1" in text


def test_the_searched_map_whatever_the_workers_and_fixed_from_its_cache(tmp_path, make_config,
                                                                          capsys, monkeypatch):
    """Searched splits: one worker and two give the same rows; two points that differ in GPU B's
    price share both climbs (same splits, same capacities, PDD's BCR follows its price); then
    `--fixed-split` on the cache runs no search and gives the given splits."""
    base, pdd = starved_systems(tmp_path, make_config)
    argv = ["map", "--x", "gpu_b_premium=0,1", "--y", "wan_gbps=10", "--baseline", str(base),
            "--pdd", str(pdd), *(a for text in SHORT for a in ("--set", text)), "--json", "--quiet"]
    maps = []
    for extra in (["--jobs", "1", "--cache", str(tmp_path / "c")], ["--jobs", "2"]):
        assert main(argv + extra) == 0
        maps.append(capsys.readouterr().out)
    assert maps[0] == maps[1]
    cheap, dear = json.loads(maps[0])
    assert cheap["pdd_split"] == dear["pdd_split"] != GIVEN["pdd"]
    assert cheap["baseline_split"] == dear["baseline_split"] != GIVEN["baseline"]
    assert cheap["pdd_capacity_rps"] == dear["pdd_capacity_rps"] and cheap["pdd_tried"] > 1
    assert cheap["pdd_bcr"] > dear["pdd_bcr"]

    def no_search(*args, **kw):
        raise AssertionError("searched again")
    monkeypatch.setattr(map_module, "find_capacity", no_search)
    assert main(argv + ["--fixed-split", "--jobs", "1", "--cache", str(tmp_path / "c")]) == 0
    fixed = json.loads(capsys.readouterr().out)
    assert [(r["baseline_split"], r["pdd_split"]) for r in fixed] == [
        (GIVEN["baseline"], GIVEN["pdd"])] * 2
    assert all(r["pdd_tried"] == r["baseline_tried"] == 1 for r in fixed)
    assert fixed[0]["pdd_capacity_rps"] < cheap["pdd_capacity_rps"]


def test_a_neighbour_moves_one_instance_between_pools_of_one_gpu_and_size(make_config):
    """Same-DC PD: P <-> D when both have as many GPUs an instance, none when not; PDD: P <-> RLD
    only, whether its MDs run another GPU or the same one, a pool of one never emptied; each
    neighbour costs the same."""
    pd = make_config(roles=(("prefill", 2), ("decode", 3)))
    P, D = "clusters.a.instances.0.count", "clusters.a.instances.1.count"
    assert neighbour_splits(pd) == [{P: 1, D: 4}, {P: 3, D: 2}]
    assert neighbour_splits(make_config(roles=(("prefill", 2), ("decode", 3, 4)))) == []
    pdd = make_config(roles=(("prefill", 2), ("relay", 1), ("decode", 3)), two_clusters=True,
                      clusters__b__gpu="h200")
    R, MD = "clusters.a.instances.1.count", "clusters.b.instances.0.count"
    assert neighbour_splits(pdd) == [{P: 1, R: 2, MD: 3}]
    # the same GPU in both datacenters: still no move across them
    same_gpu = make_config(roles=(("prefill", 2), ("relay", 1), ("decode", 3)), two_clusters=True)
    assert neighbour_splits(same_gpu) == [{P: 1, R: 2, MD: 3}]
    for split in neighbour_splits(pd):
        moved = pd.model_copy(deep=True)
        for group, n in zip(moved.clusters["a"].instances, split.values()):
            group.count = n
        assert cost_per_hour(moved) == cost_per_hour(pd)
