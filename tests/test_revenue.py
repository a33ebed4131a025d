"""Revenue arithmetic: cached input billed apart, linear in the prices, margin = revenue - cost."""
import pytest

from pddsim.config import load_config
from pddsim.sim import load_workload, simulate

SMALL = ["workload.limit=120"]


def run(*sets, path="configs/same_dc_pd.yaml"):
    cfg = load_config(path, [*SMALL, *sets], {})
    return simulate(cfg, load_workload(cfg))


def prices(i, c, o):
    return [f"pricing.input_usd_per_m={i}", f"pricing.cached_input_usd_per_m={c}",
            f"pricing.output_usd_per_m={o}"]


def test_revenue_is_the_hand_computed_sum():
    res = run(*prices(1.0, 0.25, 4.0))
    df, s = res.requests, res.summary
    done = df[df["status"] == "completed"]
    cached, inputs, outputs = done["hit_tokens"].sum(), done["input_tokens"].sum(), done["tokens_out"].sum()
    hours = s["sim_duration_s"] / 3600
    expected = ((inputs - cached) * 1.0 + cached * 0.25 + outputs * 4.0) / 1e6 / hours
    assert s["revenue_per_hour"] == pytest.approx(expected)
    assert s["margin_per_hour"] == pytest.approx(expected - s["cost_per_hour"])
    assert s["cached_input_share"] == pytest.approx(cached / inputs)
    assert s["cost_per_m_output_tokens"] == pytest.approx(s["cost_per_hour"] / (outputs / 1e6 / hours))


def test_revenue_is_linear_in_prices():
    a = run(*prices(1.0, 0.1, 3.0)).summary["revenue_per_hour"]
    b = run(*prices(0.5, 0.3, 1.0)).summary["revenue_per_hour"]
    both = run(*prices(1.5, 0.4, 4.0)).summary["revenue_per_hour"]
    doubled = run(*prices(2.0, 0.2, 6.0)).summary["revenue_per_hour"]
    assert both == pytest.approx(a + b)
    assert doubled == pytest.approx(2 * a)


def test_when_cached_input_costs_as_much_revenue_ignores_hits():
    """Same requests served with and without a prefix cache: at equal prices the bill is the same;
    at a discount for cached tokens, the run with hits earns less."""
    equal = prices(1.0, 1.0, 2.0)
    with_cache = run(*equal, "workload.time_scale=0.2")
    no_cache = run(*equal, "workload.time_scale=0.2", "prefix_cache.prefill_tokens=0")
    assert with_cache.summary["cached_input_share"] > 0.3
    assert no_cache.summary["cached_input_share"] == 0
    per_run = [r.summary["revenue_per_hour"] * r.summary["sim_duration_s"]
               for r in (with_cache, no_cache)]
    assert per_run[0] == pytest.approx(per_run[1])
    discounted = prices(1.0, 0.1, 2.0)
    earned = [r.summary["revenue_per_hour"] * r.summary["sim_duration_s"]
              for r in (run(*discounted, "workload.time_scale=0.2"),
                        run(*discounted, "workload.time_scale=0.2", "prefix_cache.prefill_tokens=0"))]
    assert earned[0] < earned[1]
