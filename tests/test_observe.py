"""Seeing inside a run: sampled state, utilisation, per-window figures and the timeline. Observing
never changes a result."""
import json

import numpy as np
import pytest
from test_instance import utilization_for

from pddsim.cli import main
from pddsim.config import load_config
from pddsim.sim import load_workload, simulate

SMALL = ["workload.limit=120"]


def run(path, *sets):
    cfg = load_config(path, [*SMALL, *sets], {})
    return simulate(cfg, load_workload(cfg))


def comparable(summary):
    return {k: v for k, v in summary.items() if not k.startswith(
        ("kv_occupancy", "kv_full", "memory_blocked", "wan_utilization"))}


@pytest.mark.parametrize("path", ["configs/same_dc_pd.yaml", "configs/pdd.yaml"])
def test_observing_changes_nothing(path):
    plain = run(path, "observe.sample_s=0")
    watched = run(path, "observe.sample_s=2", "observe.timeline=true")
    assert comparable(plain.summary) == comparable(watched.summary)
    assert plain.timeseries.empty and plain.timeline is None
    assert plain.summary["kv_occupancy_mean_prefill"] is None
    assert not watched.timeseries.empty and watched.timeline.events


def test_memory_pressure_shows_in_occupancy_and_blocking(make_config, make_workload):
    cfg = make_config(roles=(("colocated", 1),),
                 batching={"memory_utilization": utilization_for(1408), "kv_block_tokens": 16},
                 observe={"sample_s": 0.01})
    res = simulate(cfg, make_workload(*[(0.001 * i, 300, 400) for i in range(6)]))
    row = res.instances.iloc[0]
    assert row["kv_occupancy_p99"] > 0.9
    assert row["memory_blocked_share"] > 0
    assert 0 < row["kv_occupancy_mean"] <= 1.0
    occupancy = res.timeseries[res.timeseries["metric"] == "kv_occupancy"]["value"]
    assert occupancy.max() <= 1.0          # never over-committed at any sample


def test_waiting_for_the_next_iteration_is_not_blocking_on_memory(make_config, make_workload):
    """Requests arriving while an iteration runs wait for its end, with the KV pool nearly empty:
    that wait is not memory's doing, so the instance is never counted blocked on memory."""
    cfg = make_config(roles=(("colocated", 1),), observe={"sample_s": 0.001})
    res = simulate(cfg, make_workload(*[(0.0005 * i, 300, 40) for i in range(40)]))
    row = res.instances.iloc[0]
    queue = res.timeseries[res.timeseries["metric"] == "queue_depth"]["value"]
    assert queue.max() > 0                 # requests did wait
    assert row["kv_occupancy_p99"] < 0.5
    assert row["memory_blocked_share"] == 0


def test_link_utilization_matches_bytes_over_capacity(make_config, make_workload):
    """On a link with constant capacity, the sampled mean utilisation is the bytes carried over
    the capacity-time, up to the windows' edges."""
    cfg = make_config(two_clusters=True, wan={"bandwidth_gbps": 1, "rtt_ms": 0},
                 observe={"sample_s": 1.0})
    reqs = [(2.0 * i, 4000, 3) for i in range(60)]
    res = simulate(cfg, make_workload(*reqs))
    wan = res.links["wan"]
    windows = np.floor(res.summary["sim_duration_s"])
    expected = wan["bytes"] / (1e9 / 8 * windows)
    assert wan["utilization_mean"] == pytest.approx(expected, rel=0.05)
    assert res.summary["wan_utilization_mean"] == wan["utilization_mean"]


def test_windows_count_every_arrival_once():
    res = run("configs/pdd.yaml", "observe.sample_s=20")
    w = res.windows
    total = w[w["bucket"] == "all"]
    assert total["arrivals"].sum() == len(res.requests)
    assert np.allclose(total["arrival_rps"] * 20, total["arrivals"])
    assert w[w["bucket"] != "all"]["arrivals"].sum() == len(res.requests)
    assert ((w["slo_attainment"] >= 0) & (w["slo_attainment"] <= 1)).all()


def check_nesting(events):
    """Complete slices on one track nest or are disjoint; async slices open before they close."""
    by_track = {}
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] >= 0
            by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for slices in by_track.values():
        stack = []
        for start, end in sorted(slices, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start + 1e-6:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6, "slices overlap without nesting"
            stack.append(end)
    open_ = {}
    for e in events:
        key = (e.get("cat"), e.get("id"), e.get("name"))
        if e["ph"] == "b":
            assert key not in open_
            open_[key] = e["ts"]
        elif e["ph"] == "e":
            assert e["ts"] >= open_.pop(key) - 1e-6
    assert not open_, "async slices left open"


def test_timeline_file_structure(tmp_path, capsys):
    path = tmp_path / "tl.json"
    assert main(["run", "configs/pdd.yaml", *sum((["--set", s] for s in SMALL), []),
                 "--timeline", str(path), "--quiet", "--json"]) == 0
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"cluster a", "cluster b", "network", "requests"} <= names
    phases = {e["ph"] for e in events}
    assert {"X", "b", "e", "C", "M"} <= phases
    assert any(e["ph"] == "X" and e["args"]["tokens"] > 0 for e in events)
    assert any(e["ph"] == "b" and e["cat"] == "transfer" for e in events)
    assert any(e["ph"] == "C" and "kv_occupancy" in e["name"] for e in events)
    assert doc["otherData"]["events_dropped"] == 0
    check_nesting(events)


def test_timeline_limit_counts_what_it_drops_and_says_so(tmp_path, capsys):
    path = tmp_path / "tl.json"
    assert main(["run", "configs/pdd.yaml", "--set", SMALL[0], "--timeline", str(path),
                 "--timeline-limit", "500", "--quiet", "--json"]) == 0
    doc = json.loads(path.read_text())
    kept = [e for e in doc["traceEvents"] if e["ph"] != "M"]
    assert len(kept) <= 500
    dropped, first = doc["otherData"]["events_dropped"], doc["otherData"]["first_dropped_s"]
    assert dropped > 0 and first > 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and f"{dropped:,} events" in err[0]
    assert main(["run", "configs/pdd.yaml", "--set", SMALL[0], "--timeline", str(path),
                 "--quiet", "--json"]) == 0
    assert capsys.readouterr().err == ""              # nothing left out, nothing said
    check_nesting(doc["traceEvents"])


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_out_writes_every_table(tmp_path, fmt, capsys):
    out = tmp_path / "o"
    assert main(["run", "configs/same_dc_pd.yaml", "--set", SMALL[0], "--out", str(out),
                 "--out-format", fmt, "--quiet", "--json"]) == 0
    names = {p.name for p in out.iterdir()}
    assert {f"requests.{fmt}", "instances.parquet", "links.parquet", "timeseries.parquet",
            "windows.parquet", "sessions.parquet", "summary.json"} <= names


def test_the_sampler_never_keeps_a_stuck_run_alive(make_config, make_workload):
    """A run whose requests can never progress (here: its one instance dead from the start, with
    no faults configured to bring it back) ends with an error instead of ticking on forever
    because of the sampler."""
    def kill(env, dep, pipeline):
        dep.members["colocated"][0].crash()
    cfg = make_config(roles=(("colocated", 1),), observe={"sample_s": 0.5})
    with pytest.raises(RuntimeError, match="No scheduled events"):
        simulate(cfg, make_workload((0.0, 100, 5)), on_built=kill)
