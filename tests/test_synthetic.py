import hashlib
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import yaml

from pddsim.config import from_dict
from pddsim.errors import InputError
from pddsim.workload.stats import BUCKETS, trace_stats
from pddsim.workload.synthetic import AgentSpec, agent_workload, poisson_workload

ROOT = Path(__file__).resolve().parents[1]
SMALL = AgentSpec(sessions=40)
HIGH_HIT = ("[95,99)", "[99,100]")
LOW_HIT = BUCKETS[:3]


def _sessions(workload):
    by_session = defaultdict(list)
    for index, r in enumerate(workload.requests):
        by_session[r.session_id].append(index)
    return by_session


def test_agent_same_seed_same_workload_other_seed_differs():
    assert agent_workload(SMALL, 7).requests == agent_workload(SMALL, 7).requests
    assert agent_workload(SMALL, 7).requests != agent_workload(SMALL, 8).requests


def test_poisson_same_seed_same_workload_other_seed_differs():
    def make(seed):
        return poisson_workload(200, 2.0, 3000, 300, shared_prefix_tokens=1024, seed=seed)
    assert make(1).requests == make(1).requests
    assert make(1).requests != make(2).requests


def test_generators_are_pinned():
    """What the generators produce, field by field, as the tree before their per-request loops
    were rewritten (fresh ids from ranges, agent requests placed at their rank by arrival without a
    second pass): a speed-up must not move a single id, length or time. Re-pin only for an intended
    change to the workloads themselves."""
    def digest(workload):
        return hashlib.sha256(repr(list(workload.requests)).encode()).hexdigest()
    churn = AgentSpec(sessions=40, reset_prob=0.2, long_prob=0.2, max_context=60000)
    assert digest(agent_workload(churn, 7)) == (
        "1ecd261dc4cfdb37c3b17922bb6a7b9c07e66ae567a739f2fdce5c13018ab73d")
    assert digest(poisson_workload(300, 2.0, 3000, 300, shared_prefix_tokens=1024, seed=5)) == (
        "0f2638532d4263276885972d6b2d924b379fc60499b3ba3fff9969754f458c84")


def test_poisson_shares_only_the_system_prompt():
    w = poisson_workload(2000, 5.0, 4000, 200, shared_prefix_tokens=2048, block_tokens=512, seed=3)
    shared = (0, 1, 2, 3)
    assert all(r.hash_ids[:4] == shared for r in w.requests)
    unique = [b for r in w.requests for b in r.hash_ids[4:]]
    assert len(unique) == len(set(unique))
    assert all(len(r.hash_ids) == -(-r.input_tokens // 512) for r in w.requests)
    arrivals = [r.arrival_s for r in w.requests]
    assert arrivals == sorted(arrivals)
    assert sum(r.input_tokens for r in w.requests) / len(w) == pytest.approx(4000, rel=0.1)
    assert len(w) / arrivals[-1] == pytest.approx(5.0, rel=0.1)


def test_follows_point_to_the_previous_turn_of_the_same_session():
    w = agent_workload(SMALL, 1)
    arrivals = [r.arrival_s for r in w.requests]
    assert arrivals == sorted(arrivals)
    for turns in _sessions(w).values():
        assert w.requests[turns[0]].follows == -1
        for prev, cur in zip(turns, turns[1:]):
            r, p = w.requests[cur], w.requests[prev]
            assert r.follows == prev < cur
            # open loop: the previous turn's estimated service, then the think time
            expected = p.arrival_s + SMALL.service_s + SMALL.tpot_s * p.output_tokens + r.think_s
            assert r.arrival_s == pytest.approx(expected)


def test_each_turn_extends_the_previous_chain_unless_the_context_was_reset():
    w = agent_workload(SMALL, 2)
    system = SMALL.system_tokens // SMALL.block_tokens
    resets = extensions = 0
    for turns in _sessions(w).values():
        for prev, cur in zip(turns, turns[1:]):
            p, r = w.requests[prev], w.requests[cur]
            full = p.input_tokens // p.block_tokens         # a partial last block is not shared
            if r.hash_ids[:full] == p.hash_ids[:full] and r.input_tokens > p.input_tokens:
                extensions += 1
            else:
                resets += 1
                assert r.hash_ids[:system] == p.hash_ids[:system]
                assert r.hash_ids[system] not in p.hash_ids
    assert resets and extensions > 10 * resets


def test_block_ids_are_prefix_hashes():
    """Equal id => equal prefix: every id always sits at the same depth after the same parent."""
    w = agent_workload(SMALL, 4)
    parent = {}
    for r in w.requests:
        for depth, block in enumerate(r.hash_ids):
            key = (depth, r.hash_ids[depth - 1] if depth else None)
            assert parent.setdefault(block, key) == key


def test_default_spec_reproduces_the_skewed_hit_rates():
    stats = trace_stats(agent_workload(AgentSpec(), 0))
    high = sum(stats["bucket_shares"][b] for b in HIGH_HIT)
    assert 0.70 <= high <= 0.80
    assert 0.85 <= stats["hit_rate_mean"] <= 0.95
    assert stats["input_tokens"]["p50"] > 20_000


def test_drift_moves_the_low_hit_share_over_time():
    def low_share_change(drift):
        w = agent_workload(AgentSpec(sessions=120, session_rate=0.02, drift=drift), 0)
        halves = trace_stats(w, window_s=w.requests[-1].arrival_s / 2)["windows"]
        first, last = (sum(h["bucket_shares"][b] for b in LOW_HIT) for h in halves)
        return last - first
    assert low_share_change("0:0.25,1:4") > low_share_change("") + 0.05


def _session_starts(spec):
    return np.array([r.arrival_s for r in agent_workload(spec, 3).requests if r.follows < 0])


def test_a_flat_day_curve_changes_nothing():
    spec = AgentSpec(sessions=300, session_rate=0.5, turns_mean=2)
    flat = AgentSpec(sessions=300, session_rate=0.5, turns_mean=2, diurnal="0:1,13.5:1")
    np.testing.assert_allclose(_session_starts(flat), _session_starts(spec), rtol=1e-9, atol=1e-9)


def test_session_starts_follow_the_day_curve():
    """A curve rising linearly from 0.2 at midnight to 1.8 at noon and back: the mean rate over
    each quarter of the day is 0.6 or 1.4 x session_rate (over the eight days, within Poisson
    noise: ~3 standard deviations), so the day holds as many sessions as a flat one."""
    day_s, rate = 1000.0, 1.0
    spec = AgentSpec(sessions=8000, session_rate=rate, turns_mean=1, diurnal="0:0.2,12:1.8",
                     day_s=day_s)
    starts = _session_starts(spec)
    days = starts.max() / day_s
    assert days == pytest.approx(8.0, rel=0.05)
    quarters = np.histogram((starts % day_s) / day_s * 24, bins=4, range=(0, 24))[0]
    expected = np.array([0.6, 1.4, 1.4, 0.6]) * rate * day_s / 4 * days
    assert np.all(np.abs(quarters - expected) < 3 * np.sqrt(expected))


@pytest.mark.parametrize("knobs", [{"sessions": 0}, {"reset_prob": 1.5}, {"sessions": 2.5},
                                   {"drift": "0:1,1"}, {"drift": "1:1,0:2"}, {"drift": "x"},
                                   {"diurnal": "9:1,3:2"}, {"diurnal": "0:1,24:1"},
                                   {"diurnal": "0:0"}, {"day_s": 0}])
def test_bad_knobs_are_input_errors_naming_the_knob(knobs):
    name, = knobs
    raw = {"kind": "agent", "knobs": knobs}
    with pytest.raises(InputError, match=f"workload.synthetic.agent.knobs.{name}"):
        from_dict(_with_synthetic(raw), "test")


def test_poisson_rejects_a_prefix_longer_than_the_mean_input():
    raw = {"knobs": {"n_requests": 10, "rate_rps": 1.0, "input_mean": 1000, "output_mean": 100,
                     "shared_prefix_tokens": 2000}}     # kind poisson by default
    with pytest.raises(InputError, match="workload.synthetic.poisson.knobs: .*shared_prefix_tokens"):
        from_dict(_with_synthetic(raw), "test")


def test_unknown_knob_is_named_at_load():
    raw = {"kind": "poisson", "knobs": {"n_requests": 10, "rate_rps": 1.0, "input_mean": 1000,
                                        "output_mean": 100, "nope": 1}}
    with pytest.raises(InputError, match="workload.synthetic.poisson.knobs.nope: Extra inputs"):
        from_dict(_with_synthetic(raw), "test")


def _with_synthetic(synthetic: dict) -> dict:
    cfg = yaml.safe_load((ROOT / "configs" / "same_dc_pd.yaml").read_text())
    cfg["workload"] = {"synthetic": synthetic}
    return cfg
