"""Nothing hangs: runs that once looped forever or died in SimPy end, each bounded in wall time."""
import json
import subprocess
import sys

import pytest

from pddsim.config import bundled
from pddsim.errors import InputError
from pddsim.sim import simulate
from pddsim.workload.model import TraceRequest, Workload


def _run(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "pddsim.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def test_a_one_token_prompt_late_in_a_cross_dc_run_finishes(tmp_path):
    # The review's reproducer: one 1-token prompt at 148 s (here 777 s, which looped on the bundled
    # cross-DC config) never finished: the WAN's last fraction of a byte took no clock time.
    trace = tmp_path / "one.jsonl"
    trace.write_text(json.dumps({"arrival_s": 777, "input_tokens": 1, "output_tokens": 3}) + "\n")
    p = _run("run", bundled("cross_dc_pd.yaml"), "--trace", trace, "--json", "--quiet")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out.get("summary", out)["requests_completed"] == 1


CROSS_SESSION = [   # request 2 (session 0) follows request 1 (session 1)
    {"arrival_s": 0, "input_tokens": 100, "output_tokens": 5, "session_id": 0},
    {"arrival_s": 1, "input_tokens": 100, "output_tokens": 5, "session_id": 1},
    {"arrival_s": 2, "input_tokens": 100, "output_tokens": 5, "session_id": 0, "follows": 1},
]


@pytest.mark.parametrize("follower", [
    {"session_id": 0, "follows": 1},        # a turn of another session
    {"follows": 1},                          # no session at all
])
def test_a_turn_following_another_session_with_concurrent_starts_is_refused(tmp_path, input_error,
                                                                            follower):
    # one session at a time, closed loop: session 0 waited for a turn of session 1, which could
    # only start once session 0 had ended (SimPy: no scheduled events left, exit 1)
    trace = tmp_path / "cross.jsonl"
    rows = CROSS_SESSION[:2] + [{"arrival_s": 2, "input_tokens": 100, "output_tokens": 5, **follower}]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = _run("run", bundled("same_dc_pd.yaml"), "--trace", trace, "--quiet", "--set",
             "workload.replay=closed", "--set", "workload.session_start=concurrent",
             "--set", "workload.concurrent_sessions=1")
    input_error(p.returncode, p.stderr, "cross.jsonl: request 2 follows request 1 of another session")


def _cross_session(make_config, start):
    w = Workload([TraceRequest(**r) for r in CROSS_SESSION], sessions=2)
    cfg = make_config(workload__replay="closed", workload__session_start=start,
                      **({"workload__concurrent_sessions": 1} if start == "concurrent" else {}))
    return simulate(cfg, w)


def test_a_turn_following_another_session_is_defined_when_sessions_start_on_their_own(make_config):
    # recorded starts: every session starts at its time, so request 2 starts 0 s after request 1
    # ends, whichever session it is in (the bathtub's warmed stream is built so)
    out = _cross_session(make_config, "recorded").requests.set_index("request")
    assert (out.status == "completed").all()
    assert out.loc[2, "arrival_s"] == pytest.approx(out.loc[1, "finish_s"])


def test_the_replay_refuses_it_when_sessions_wait_for_each_other(make_config):
    with pytest.raises(InputError, match="request 2 follows request 1 of another session"):
        _cross_session(make_config, "concurrent")
