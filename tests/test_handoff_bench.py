from dataclasses import replace

import pytest

from pddsim.experiments.handoff_bench import HandoffBenchSpec, format_bench, handoff_microbenchmark

SHORT = replace(HandoffBenchSpec(), runs=200)   # enough runs for the comparisons, quick


@pytest.fixture(scope="module")
def default():
    return handoff_microbenchmark()


def test_same_seed_same_result():
    assert handoff_microbenchmark(SHORT, seed=3) == handoff_microbenchmark(SHORT, seed=3)


def test_recompute_is_immune_to_wan_jitter(default):
    assert default["recompute"]["std_ms"] < default["kv_transfer"]["std_ms"] / 4


def test_narrower_wan_slows_kv_shipping_not_recompute():
    wide = handoff_microbenchmark(SHORT)
    narrow = handoff_microbenchmark(replace(SHORT, bandwidth_gbps=SHORT.bandwidth_gbps / 2))
    assert narrow["kv_transfer"]["mean_ms"] > 1.5 * wide["kv_transfer"]["mean_ms"]
    assert narrow["recompute"]["mean_ms"] == pytest.approx(wide["recompute"]["mean_ms"], rel=0.02)


def test_defaults_land_near_the_paper(default):
    assert default["kv_transfer"]["mean_ms"] == pytest.approx(
        default["paper"]["kv_transfer"]["mean_ms"], rel=0.25)
    # the extend step is priced as the simulator prices a prefill chunk: known to be short of the
    # paper's (see the module docstring), but not by more than half
    recompute, paper = default["recompute"]["mean_ms"], default["paper"]["recompute"]["mean_ms"]
    assert 0.5 * paper < recompute < paper


def test_recompute_tail_is_short(default):
    rec = default["recompute"]
    assert rec["max_ms"] - rec["mean_ms"] < 0.1 * rec["mean_ms"]


def test_format_shows_ours_beside_the_paper(default):
    text = format_bench(default)
    assert "kv_transfer" in text and "recompute" in text
    assert f"{default['recompute']['mean_ms']:.1f}" in text and "305.0" in text
