"""Revenue arithmetic: cached input billed apart, linear in the prices, margin = revenue - cost."""
import pandas as pd
import pytest

from pddsim.config import load_config
from pddsim.cost import revenue_summary
from pddsim.sim import load_workload, simulate

SMALL = ["workload.limit=120"]


def run(*sets, path="configs/same_dc_pd.yaml"):
    cfg = load_config(path, [*SMALL, *sets], {})
    return simulate(cfg, load_workload(cfg))


def prices(i, c, o):
    return [f"pricing.input_usd_per_m={i}", f"pricing.cached_input_usd_per_m={c}",
            f"pricing.output_usd_per_m={o}"]


def test_revenue_of_a_small_case_worked_by_hand():
    """Two completed requests (1 M input each, 0.4 M of A's cached; 0.5 M output each) and a failed
    one, over half an hour at $1 / $0.25 / $4 per M input / cached / output, on $10 an hour."""
    cfg = load_config("configs/same_dc_pd.yaml", prices(1.0, 0.25, 4.0), {})
    requests = pd.DataFrame({"status": ["completed", "completed", "failed"],
                             "input_tokens": [1_000_000, 1_000_000, 5_000_000],
                             "hit_tokens": [400_000, 0, 0],
                             "tokens_out": [500_000, 500_000, 0]})
    s = revenue_summary(requests, cfg, duration_s=1800.0, cost_usd_per_hour=10.0)
    # (1.6 M uncached x $1 + 0.4 M cached x $0.25 + 1 M out x $4) / 0.5 h = $5.7 / 0.5 h
    assert s["revenue_per_hour"] == pytest.approx(11.4)
    assert s["margin_per_hour"] == pytest.approx(1.4)
    assert s["cached_input_share"] == pytest.approx(0.2)
    assert s["cost_per_m_input_tokens"] == pytest.approx(2.5)     # $10 / (2 M per 0.5 h)
    assert s["cost_per_m_output_tokens"] == pytest.approx(5.0)    # $10 / (1 M per 0.5 h)


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
