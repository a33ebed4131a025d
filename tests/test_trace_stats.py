from pathlib import Path

import numpy as np
import pytest

from pddsim.errors import InputError
from pddsim.workload.model import TraceRequest, Workload
from pddsim.workload.readers import read_workload
from pddsim.workload.stats import BUCKETS, bucket_index, format_stats, plot_bucket_shares, trace_stats

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
BLOCK = 10


def _req(t, n_in, ids):
    return TraceRequest(arrival_s=t, input_tokens=n_in, output_tokens=5, hash_ids=tuple(ids),
                        block_tokens=BLOCK)


# (arrival, input tokens, chain): hit rates by hand, unbounded cache / LRU of 4 blocks
HAND = Workload([
    _req(0, 30, [1, 2, 3]),             # 0                 | 0
    _req(1, 40, [1, 2, 3, 4]),          # 30/40             | 30/40
    _req(2, 100, range(1, 11)),         # 40/100            | 40/100: 5.. do not fit
    _req(3, 105, range(1, 12)),         # 100/105           | 40/105
    _req(4, 20, [1, 2]),                # 20/20             | 20/20
    _req(5, 11, [1, 13]),               # 10/11             | 10/11: evicts 4, the LRU leaf
    _req(6, 15, [1, 2]),                # 20 capped at 15   | 15/15
], source="hand")
INPUT = 30 + 40 + 100 + 105 + 20 + 11 + 15
HITS = [0, 30 / 40, 40 / 100, 100 / 105, 1, 10 / 11, 1]
LRU_HITS = [0, 30 / 40, 40 / 100, 40 / 105, 1, 10 / 11, 1]


def _shares(counts):
    return {b: counts.get(b, 0) / 7 for b in BUCKETS}


def test_bucket_edges_are_left_closed():
    rates = np.array([0, 0.4999, 0.5, 0.7, 0.9, 0.95, 0.989, 0.99, 1.0])
    assert [BUCKETS[i] for i in bucket_index(rates)] == [
        "[0,50)", "[0,50)", "[50,70)", "[70,90)", "[90,95)", "[95,99)", "[95,99)",
        "[99,100]", "[99,100]"]


def test_hand_made_trace_unbounded_cache():
    s = trace_stats(HAND)
    assert s["requests"] == 7 and s["duration_s"] == 6 and s["arrival_rate_rps"] == 7 / 6
    assert s["hit_rate_mean"] == pytest.approx(sum(HITS) / 7)
    assert s["hit_rate_token_weighted"] == pytest.approx((0 + 30 + 40 + 100 + 20 + 10 + 15) / INPUT)
    assert s["bucket_shares"] == pytest.approx(
        _shares({"[0,50)": 2, "[70,90)": 1, "[90,95)": 1, "[95,99)": 1, "[99,100]": 2}))
    assert s["input_tokens"]["mean"] == pytest.approx(INPUT / 7)
    assert s["input_tokens"]["p50"] == 30
    assert "lru" not in s and "note" not in s


def test_hand_made_trace_lru_cache():
    lru = trace_stats(HAND, lru_capacity_tokens=4 * BLOCK)["lru"]
    assert lru["hit_rate_mean"] == pytest.approx(sum(LRU_HITS) / 7)
    assert lru["hit_rate_token_weighted"] == pytest.approx((30 + 40 + 40 + 20 + 10 + 15) / INPUT)
    assert lru["bucket_shares"] == pytest.approx(
        _shares({"[0,50)": 3, "[70,90)": 1, "[90,95)": 1, "[99,100]": 2}))


def test_windows_split_requests_by_arrival():
    windows = trace_stats(HAND, window_s=2)["windows"]
    assert [w["start_s"] for w in windows] == [0, 2, 4]
    assert [w["requests"] for w in windows] == [2, 2, 3]    # the last arrival closes the last one
    assert windows[0]["bucket_shares"]["[0,50)"] == 0.5
    default = trace_stats(HAND)["windows"]
    assert len(default) == 10 and sum(w["requests"] for w in default) == 7


def test_trace_without_hashes_hits_nothing():
    w = Workload([TraceRequest(arrival_s=t, input_tokens=100, output_tokens=10) for t in range(4)])
    s = trace_stats(w)
    assert s["hit_rate_mean"] == 0 and s["bucket_shares"]["[0,50)"] == 1
    assert "no prefix hashes" in s["note"]


def test_bad_arguments_are_input_errors():
    with pytest.raises(InputError):
        trace_stats(Workload([]))
    with pytest.raises(InputError):
        trace_stats(HAND, window_s=0)


def test_plot_and_text_table(tmp_path):
    path = tmp_path / "buckets.png"
    stats = trace_stats(HAND, window_s=2, lru_capacity_tokens=4 * BLOCK)
    plot_bucket_shares(HAND, path, window_s=2, lru_capacity_tokens=4 * BLOCK, stats=stats)
    assert path.read_bytes().startswith(b"\x89PNG")
    plot_bucket_shares(HAND, tmp_path / "unbounded.png")
    assert (tmp_path / "unbounded.png").stat().st_size > 0
    text = format_stats(stats)
    assert all(b in text for b in BUCKETS) and "LRU 40 tokens" in text


def test_mooncake_conversation_trace():
    path = TRACES / "mooncake" / "conversation_trace.jsonl"
    if not path.exists():
        pytest.skip("shared traces absent")
    s = trace_stats(read_workload(path))
    assert s["requests"] == 12_031
    assert 0 < s["hit_rate_mean"] < 1 and sum(s["bucket_shares"].values()) == pytest.approx(1)


def test_agent_trace_directory():
    path = TRACES / "kv_cache_tester"
    if not path.exists():
        pytest.skip("shared traces absent")
    trace = read_workload(path, limit=2000)     # whole conversations: a few more
    s = trace_stats(trace)
    assert s["requests"] == len(trace) >= 2000
    assert s["bucket_shares"]["[99,100]"] > s["bucket_shares"]["[50,70)"]
