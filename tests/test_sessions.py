"""Per-session task completion and its slowdown against a zero-queue run."""
import pandas as pd
import pytest

from pddsim.sessions import COLUMNS, session_summary, session_table
from pddsim.sim import simulate
from pddsim.workload.model import TraceRequest, Workload

BASE, PER_TOKEN = 0.01, 1e-5     # the linear table: an iteration takes BASE + PER_TOKEN * tokens
CHUNK = 64
CLOSED = {"trace": "x", "replay": "closed"}
PDD = (("prefill", 1), ("relay", 1), ("decode", 1))


def iteration(tokens: int) -> float:
    return BASE + PER_TOKEN * tokens


def alone(todo: int, output: int) -> float:
    """A colocated request served alone: `todo` prompt tokens in chunks, then output - 1 decodes."""
    full, tail = divmod(todo, CHUNK)
    prefill = full * iteration(CHUNK) + (iteration(tail) if tail else 0.0)
    return prefill + (output - 1) * iteration(1)


def run(make_config, w: Workload, **kw):
    kw.setdefault("workload", CLOSED)
    cfg = make_config(base=BASE, per_token=PER_TOKEN, **kw)
    res = simulate(cfg, w)
    return res.requests, session_table(cfg, w, res.requests).set_index("session")


def two_tasks(second_start: float) -> Workload:
    """Session 0: two turns, the second re-sending the first's 100-token prompt; session 1: one."""
    return Workload([TraceRequest(0.0, 100, 3, hash_ids=(1, 2), block_tokens=50, session_id=0),
                     TraceRequest(second_start, 100, 2, session_id=1),
                     TraceRequest(9.0, 200, 2, hash_ids=(1, 2, 3, 4), block_tokens=50, session_id=0,
                                  think_s=2.5, follows=0)], sessions=2)


def chats(sessions=3, turns=3, gap_s=100.0, tokens=300) -> Workload:
    """Sessions `gap_s` apart whose turns, a second apart in open loop, grow one shared context."""
    order = sorted((gap_s * s + t, s, t) for s in range(sessions) for t in range(turns))
    index = {(s, t): i for i, (_, s, t) in enumerate(order)}
    blocks = tokens // 50
    return Workload([TraceRequest(arrival, tokens * (t + 1), 20 + 10 * t, block_tokens=50,
                                  hash_ids=tuple(range(1000 * s, 1000 * s + blocks * (t + 1))),
                                  session_id=s, think_s=0.5, follows=index.get((s, t - 1), -1))
                     for arrival, s, t in order], sessions=sessions)


def test_ideal_completion_is_hand_computed_and_contention_stretches_it(make_config):
    df, table = run(make_config, two_tasks(second_start=0.0), roles=(("colocated", 1),),
                    batching={"prefill_chunk": CHUNK})
    assert list(df.hit_tokens) == [0, 0, 100]         # the second turn reuses the first's prompt
    assert list(table.columns) == COLUMNS[1:]
    assert table.loc[0, "ideal_s"] == pytest.approx(alone(100, 3) + 2.5 + alone(100, 2), abs=1e-12)
    assert table.loc[1, "ideal_s"] == pytest.approx(alone(100, 2), abs=1e-12)
    first, last = df[df.session == 0].iloc[0], df[df.session == 0].iloc[-1]
    assert table.loc[0, "completion_s"] == pytest.approx(last.finish_s - first.arrival_s)
    assert list(table.requests) == [2, 1]
    assert (table.slowdown > 1).all()                 # both tasks' first turns shared iterations


def test_open_loop_ideal_keeps_the_recorded_arrivals(make_config):
    _, table = run(make_config, two_tasks(second_start=0.5), roles=(("colocated", 1),),
                   batching={"prefill_chunk": CHUNK}, workload={"trace": "x"})
    assert table.loc[0, "ideal_s"] == pytest.approx(9.0 + alone(100, 2), abs=1e-12)
    assert table.slowdown.to_numpy() == pytest.approx([1.0, 1.0], abs=1e-9)


@pytest.mark.parametrize("deployment", [
    {"roles": (("colocated", 1),), "batching": {"prefill_chunk": CHUNK}},
    {"roles": (("prefill", 1), ("decode", 1))},
    {"two_clusters": True, "wan": {"bandwidth_gbps": 1, "rtt_ms": 40},
     "prefix_cache": {"decode_tokens": None}},
    {"roles": PDD, "two_clusters": True,
     "pdd": {"path_policy": "finish_on_relay", "relay_above_s": 0}},
    {"roles": (("prefill", 1), ("decode", 1)), "roofline": True,
     "batching": {"prefill_chunk": 128}},
], ids=["colocated", "pd", "pd-wan-drc", "pdd-relay", "pd-roofline"])
def test_one_request_at_a_time_has_no_slowdown(make_config, deployment):
    df, table = run(make_config, chats(), **deployment)
    assert df.hit_tokens.sum() > 0
    assert table.slowdown.to_numpy() == pytest.approx(1.0, abs=1e-9)


def test_fewer_instances_stretch_tasks(make_config):
    w = chats(sessions=8, gap_s=0.0, tokens=2000)
    _, busy = run(make_config, w, roles=(("colocated", 1),))
    _, roomy = run(make_config, w, roles=(("colocated", 4),))
    assert busy.slowdown.median() > roomy.slowdown.median() > 1
    assert busy.completion_s.mean() > roomy.completion_s.mean()


def test_loaded_wan_stretches_tasks_against_the_nominal_line(make_config):
    wan = {"bandwidth_gbps": 1, "rtt_ms": 40}
    _, free = run(make_config, chats(), two_clusters=True, wan=wan)
    _, loaded = run(make_config, chats(), two_clusters=True,
                    wan={**wan, "background": {"mean": 0.5, "std": 0.0}})
    assert loaded.ideal_s.to_numpy() == pytest.approx(free.completion_s.to_numpy(), rel=1e-9)
    assert (loaded.slowdown > 1.2).all()


def test_sub_agents_count_along_the_critical_path(make_config):
    """A parent spawns a long sub-agent and a short one that takes a second turn after a long
    think: the task ends with the short one's branch, not with the sum of its requests."""
    w = Workload([TraceRequest(0.0, 100, 2, session_id=0),
                  TraceRequest(1.0, 100, 100, session_id=0, think_s=1.0, follows=0),
                  TraceRequest(1.0, 100, 2, session_id=0, think_s=1.0, follows=0),
                  TraceRequest(2.0, 100, 2, session_id=0, think_s=5.0, follows=2)], sessions=1)
    _, table = run(make_config, w, roles=(("colocated", 2),), batching={"prefill_chunk": CHUNK})
    short = alone(100, 2)
    assert table.loc[0, "ideal_s"] == pytest.approx(short + 1.0 + short + 5.0 + short, abs=1e-12)
    assert short + 1.0 + alone(100, 100) < table.loc[0, "ideal_s"]
    assert table.loc[0, "completion_s"] >= table.loc[0, "ideal_s"] - 1e-9


def test_requests_without_sessions_give_no_rows(make_config):
    w = Workload([TraceRequest(0.0, 100, 2), TraceRequest(0.5, 100, 2)])
    _, table = run(make_config, w, roles=(("colocated", 1),))
    assert table.empty
    summary = session_summary(table)
    assert summary["sessions"] == 0
    assert all(v is None for k, v in summary.items() if k != "sessions")


def test_summary_percentiles(make_config):
    """Five sessions' completions 1..5 s and slowdowns 1, 1.5, 2, 3, 10: the median is the third,
    the P90 lies 0.6 of the way from the fourth to the fifth (linear interpolation)."""
    _, table = run(make_config, chats(sessions=5), roles=(("colocated", 1),))
    assert session_summary(table)["sessions"] == 5
    table = pd.DataFrame({"completion_s": [4.0, 1.0, 5.0, 2.0, 3.0],
                          "slowdown": [1.5, 10.0, 1.0, 3.0, 2.0]})
    assert session_summary(table) == pytest.approx({
        "sessions": 5, "task_completion_p50_s": 3.0, "task_completion_p90_s": 4.6,
        "task_slowdown_p50": 2.0, "task_slowdown_p90": 7.2})
