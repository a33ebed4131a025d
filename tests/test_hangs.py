"""Nothing hangs: runs that once looped forever or died in SimPy end, each bounded in wall time."""
import json
import subprocess
import sys

from pddsim.config import bundled


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
