"""The compiled build and the interpreted one give the same results: every bundled scenario (shortened
as the invariant tests shorten them) run in a process of each build, every table and summary figure
compared bit for bit. Skips where the engine is not compiled (no C compiler at install)."""
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from test_invariants import SCENARIOS

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parent

RUN = """
import pickle, sys
sys.path.insert(0, {tests!r})
from test_invariants import small
from pddsim.build import compiled
from pddsim.sim import load_workload, simulate
out = {{"compiled": compiled()}}
for name in {names!r}:
    cfg = small(name)
    res = simulate(cfg, load_workload(cfg))
    out[name] = ({{k: v for k, v in res.summary.items() if k != "wall_s"}}, res.requests, res.timeseries)
with open(sys.argv[1], "wb") as f:
    pickle.dump(out, f)
"""


def run(tmp_path, pure: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PDDSIM_PURE"}
    if pure:
        env["PDDSIM_PURE"] = "1"
    path = tmp_path / ("pure.pickle" if pure else "built.pickle")
    subprocess.run([sys.executable, "-c", RUN.format(tests=str(TESTS), names=SCENARIOS), str(path)],
                   env=env, check=True)
    with open(path, "rb") as f:
        return pickle.load(f)


def same(a, b) -> bool:
    return a == b or (a != a and b != b)          # NaN is NaN


def test_the_compiled_and_the_interpreted_build_give_the_same_results(tmp_path):
    built = run(tmp_path, pure=False)
    if not built.pop("compiled"):
        pytest.skip("the engine is not compiled here (no C compiler when it was installed)")
    pure = run(tmp_path, pure=True)
    assert not pure.pop("compiled")
    for name in SCENARIOS:
        (s1, r1, t1), (s2, r2, t2) = built[name], pure[name]
        assert s1.keys() == s2.keys() and all(same(s1[k], s2[k]) for k in s1), name
        assert r1.equals(r2) and t1.equals(t2), name
