"""Where each request's time went: the stages partition its latency, and the serving-benchmark names
restate the summary in the units such benchmarks use."""
import numpy as np
import pytest
from test_instance import utilization_for

from pddsim.config import load_config
from pddsim.metrics import stage_table
from pddsim.sim import load_workload, simulate
from pddsim.system.stages import STAGES

STAGE_COLS = [f"stage_{s}_s" for s in STAGES]
TTFT_COLS = [f"ttft_{s}_s" for s in STAGES]


def small(path, **sets):
    cfg = load_config(path, [f"{k}={v}" for k, v in sets.items()], {})
    return cfg, load_workload(cfg)


def assert_partition(df):
    done = df[df["status"] == "completed"]
    assert len(done)
    np.testing.assert_allclose(done[STAGE_COLS].sum(axis=1), done["e2e_s"], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(done[TTFT_COLS].sum(axis=1), done["ttft_s"], rtol=1e-9, atol=1e-9)
    assert (done[STAGE_COLS].to_numpy() >= 0).all()
    # a stage's share of the TTFT never exceeds its share of the whole latency
    assert (done[TTFT_COLS].to_numpy() <= done[STAGE_COLS].to_numpy() + 1e-12).all()


@pytest.mark.parametrize("path", ["configs/same_dc_pd.yaml", "configs/cross_dc_pd.yaml",
                                  "configs/pdd.yaml", "configs/colocated.yaml"])
def test_stages_add_up_to_ttft_and_e2e(path):
    cfg, w = small(path, **{"workload.limit": 300})
    result = simulate(cfg, w)
    assert_partition(result.requests)
    table = stage_table(result.summary)
    assert list(table.index) == list(STAGES)
    assert table["e2e_share"].sum() == pytest.approx(1.0)


def test_stage_follows_the_path():
    """Cross-DC PD waits on the WAN before its first token; PDD's relayed requests do not."""
    cfg, w = small("configs/cross_dc_pd.yaml", **{"workload.limit": 300})
    df = simulate(cfg, w).requests
    assert (df["ttft_kv_wan_s"] > 0).mean() > 0.9 and (df["ttft_kv_rdma_s"] == 0).all()
    cfg, w = small("configs/pdd.yaml", **{"workload.limit": 300})
    df = simulate(cfg, w).requests
    relayed = df[df["pipeline"] == "p_rld_md"]
    direct = df[df["pipeline"] == "p_md"]
    assert len(relayed) and len(direct)
    assert (relayed["ttft_kv_wan_s"] == 0).all() and (relayed["ttft_kv_rdma_s"] > 0).all()
    assert (relayed["stage_relay_decode_s"] > 0).all()
    assert (direct["stage_relay_decode_s"] == 0).all() and (direct["ttft_kv_wan_s"] > 0).all()


def test_preempted_requests_spend_time_recomputing(make_config, make_workload):
    cfg = make_config(roles=(("colocated", 1),),
                 batching={"memory_utilization": utilization_for(1408), "kv_block_tokens": 16})
    result = simulate(cfg, make_workload(*[(0.001 * i, 300, 400) for i in range(6)]))
    assert result.instances["preemptions"].sum() > 0
    df = result.requests
    assert_partition(df)
    assert (df["stage_recompute_s"] > 0).any()


def test_serving_benchmark_names_restate_the_summary():
    cfg, w = small("configs/pdd.yaml", **{"workload.limit": 300})
    s = simulate(cfg, w).summary
    done_tokens = s["total_output_tokens"]
    assert s["completed"] == s["requests_completed"] and s["failed"] == s["requests_failed"]
    assert s["duration"] == pytest.approx(s["sim_duration_s"])
    assert s["request_throughput"] == pytest.approx(s["throughput_rps"])
    assert s["request_goodput"] == pytest.approx(s["goodput_rps"])
    assert s["output_throughput"] == pytest.approx(done_tokens / s["duration"])
    assert s["mean_ttft_ms"] == pytest.approx(1e3 * s["ttft_mean_s"])
    assert s["median_ttft_ms"] == pytest.approx(1e3 * s["ttft_p50_s"])
    assert s["p99_ttft_ms"] == pytest.approx(1e3 * s["ttft_p99_s"])
    assert s["mean_tpot_ms"] == pytest.approx(1e3 * s["tpot_mean_s"])
    for stat in ("mean", "median", "std", "p90", "p95", "p99"):
        for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
            assert f"{stat}_{name}" in s


def test_mean_itl_is_the_mean_over_all_gaps():
    cfg, w = small("configs/same_dc_pd.yaml", **{"workload.limit": 300})
    result = simulate(cfg, w)
    df = result.requests
    done = df[(df["status"] == "completed") & (df["tokens_out"] > 1)]
    gaps = done["tokens_out"] - 1
    total_gap_time = (done["tpot_s"] * gaps).sum()
    assert result.summary["mean_itl_ms"] == pytest.approx(1e3 * total_gap_time / gaps.sum())
