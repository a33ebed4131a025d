"""Bad input found by a reliability review: each ends with exit status 2 and one stderr line naming
the file and line or the field, in bounded time and memory (a subprocess with a timeout where an
unbounded run was the failure); none is an internal error, a hang or a silently wrong figure."""
import json
import subprocess
import sys

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from pddsim.cli import main
from pddsim.config import bundled
from pddsim.sim import RUN_FILES
from pddsim.workload.readers import _json_depth, read_workload

NATIVE = {"arrival_s": 0, "input_tokens": 100, "output_tokens": 5}
AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
HUGE = "1" + "0" * 4400                     # past Python's 4,300-digit int-from-text limit
DEEP = 5000                                  # nesting past the JSON decoder's recursion


def _cli(*args, timeout=60):
    """The CLI in a subprocess, bounded in wall time (a hang fails the test, not the suite)."""
    p = subprocess.run([sys.executable, "-m", "pddsim.cli", *map(str, args)],
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stderr


def _native(*objs) -> str:
    return "".join(json.dumps(o) + "\n" for o in objs)


def _agent_doc(depth: int) -> str:
    """An agent conversation whose sub-agents nest `depth` deep (text: too deep to encode)."""
    leaf = json.dumps({"t": 1, "in": 10, "out": 2, "hash_ids": []})
    opening = '{"type": "subagent", "t": 1, "requests": [' + leaf + ", "
    return ('{"block_size": 64, "requests": [' + leaf + ", " + opening * depth + leaf
            + "]}" * depth + "]}")


TRACES = {   # name: (text, what the error line must name)
    "huge_int.jsonl": (_native(NATIVE)[:-1].replace('"input_tokens": 100', f'"input_tokens": {HUGE}')
                       + "\n", "huge_int.jsonl:1"),
    "deep.jsonl": ('{"arrival_s": 0, "input_tokens": 1, "output_tokens": 1, "x": '
                   + "[" * DEEP + "]" * DEEP + "}\n", "deep.jsonl:1"),
    "deep.json": ("[" * DEEP + "]" * DEEP, "deep.json"),
    "unicode_digits.csv": (AZURE_HEAD + "2023-11-16 18:15:46.68,\uff11\uff12,10\n",
                           "unicode_digits.csv:2"),
    "unicode_stamp.csv": (AZURE_HEAD + "\uff12023-11-16 18:15:46.68,12,10\n", "unicode_stamp.csv:2"),
    "unicode_fraction.csv": (AZURE_HEAD + "2023-11-16 18:15:46.\uff16,12,10\n",
                             "unicode_fraction.csv:2"),
    "mixed_tz.csv": (AZURE_HEAD + "2023-11-16 18:15:46.68,12,10\n2023-11-16 18:15:47+01:00,12,10\n",
                     "mixed_tz.csv:3"),
    "long_field.csv": (AZURE_HEAD + "2023-11-16 18:15:46.68,12," + "1" * 140_000 + "\n",
                       "long_field.csv:2"),
    "late.jsonl": (_native(NATIVE | {"arrival_s": 1e17}), "late.jsonl: request 0"),
}


def test_sub_agents_nested_100_deep_are_read(tmp_path):
    path = tmp_path / "deep_agents.json"
    path.write_text(_agent_doc(100))
    assert len(read_workload(path)) == 102


@pytest.mark.parametrize("depth", [5000, 50_000])
def test_sub_agents_nested_deeper_are_one_line(tmp_path, capsys, input_error, depth):
    path = tmp_path / "deep_agents.json"
    path.write_text(_agent_doc(depth))
    code = main(["run", str(bundled("same_dc_pd.yaml")), "--trace", str(path), "--quiet"])
    input_error(code, capsys.readouterr().err, "deep_agents.json", "nested too deep")


@pytest.mark.parametrize("name", sorted(TRACES))
def test_a_bad_trace_is_one_line(tmp_path, capsys, input_error, name):
    text, where = TRACES[name]
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    code = main(["run", str(bundled("same_dc_pd.yaml")), "--trace", str(path), "--quiet"])
    input_error(code, capsys.readouterr().err, where)


CONFIGS = {   # name: (yaml text, what the error line must name)
    "huge_seed.yaml": (f"seed: {HUGE}\n", "huge_seed.yaml"),
    "negative_seed.yaml": ("seed: -1\n", "seed"),
    "nan_price.yaml": ("gpu_prices: {h800: .nan}\n", "gpu_prices"),
    "tiny_sample.yaml": ("observe: {sample_s: 1.0e-9}\n", "observe.sample_s"),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_bad_config_field_is_one_line(tmp_path, capsys, input_error, name):
    text, where = CONFIGS[name]
    raw = yaml.safe_load(bundled("same_dc_pd.yaml").read_text())
    path = tmp_path / name
    base = yaml.safe_dump({k: v for k, v in raw.items() if k not in ("seed", "gpu_prices", "observe")})
    path.write_text(base + text)
    code = main(["validate", str(path)])
    input_error(code, capsys.readouterr().err, where)


@pytest.mark.parametrize("args, where", [
    (["--seed", "-1"], "--seed"),
    (["--seed", HUGE], "--seed"),
    (["--sample-s", "0.000001"], "sample_s"),
    (["--set", f"seed={HUGE}"], "seed"),
])
def test_a_bad_run_flag_is_one_line(input_error, args, where):
    code, err = _cli("run", bundled("same_dc_pd.yaml"), "--quiet", *args, timeout=30)
    input_error(code, err, where)


def test_out_at_an_existing_file_is_refused_before_the_run(tmp_path, input_error):
    target = tmp_path / "taken"
    target.write_text("x")
    code, err = _cli("run", bundled("paper/pdd.yaml"), "--out", target, "--quiet", timeout=20)
    input_error(code, err, str(target))
    assert target.read_text() == "x"


@pytest.mark.parametrize("override, where", [
    ("clusters.a.instances.0.count=10000000", "clusters.a.instances.0.count"),
])
def test_what_a_run_would_allocate_is_checked_before_it_runs(input_error, override, where):
    for command in ("validate", "run"):
        code, err = _cli(command, bundled("same_dc_pd.yaml"), "--set", override,
                         *(["--quiet"] if command == "run" else []), timeout=30)
        input_error(code, err, where)


def test_a_synthetic_request_no_instance_can_hold_is_refused(input_error):
    code, err = _cli("run", bundled("same_dc_pd.yaml"), "--quiet",
                     "--set", "workload={synthetic: {kind: poisson, knobs: {n_requests: 5, "
                     "rate_rps: 1, input_mean: 100, output_mean: 1.0e12}}}", timeout=30)
    input_error(code, err, "workload.synthetic: request")


def test_a_sampling_period_the_trace_span_cannot_hold_is_refused(tmp_path, capsys, input_error):
    trace = tmp_path / "long.jsonl"
    trace.write_text(_native(NATIVE, NATIVE | {"arrival_s": 10_000}))
    code = main(["run", str(bundled("same_dc_pd.yaml")), "--trace", str(trace), "--quiet",
                 "--sample-s", "0.001"])
    input_error(code, capsys.readouterr().err, "observe.sample_s", "1e+07 samples")


def test_the_default_sampling_period_follows_the_time_scale(make_config, make_workload):
    from pddsim.sim import sample_period_s
    w = make_workload(*[(float(t), 100, 5) for t in range(0, 4001, 400)])
    for scale in (0.05, 1.0, 4.0):
        cfg = make_config(workload__time_scale=scale)
        assert sample_period_s(cfg, w) == pytest.approx(max(1.0, 4000 / scale / 200))


# ---- output folders ---------------------------------------------------------------------------

def _tiny(tmp_path) -> list[str]:
    trace = tmp_path / "tiny.jsonl"
    trace.write_text(_native(NATIVE, NATIVE | {"arrival_s": 1}))
    return ["--trace", str(trace), "--quiet"]


def test_run_out_into_an_old_run_folder_leaves_no_stale_table(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(bundled("same_dc_pd.yaml")), *_tiny(tmp_path), "--out", str(out),
                 "--out-format", "csv"]) == 0
    (out / "notes.txt").write_text("mine")
    assert main(["run", str(bundled("pdd.yaml")), *_tiny(tmp_path), "--out", str(out)]) == 0
    assert not (out / "requests.csv").exists()          # the earlier run's table is gone
    assert (out / "requests.parquet").is_file() and (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / "summary.json").read_text())["system"] == "pdd"
    # every file a run writes is one the next run would clear
    assert {p.name for p in out.iterdir()} - {"notes.txt"} <= set(RUN_FILES)


def test_compare_out_clears_earlier_comparisons_and_stays_in_its_folder(tmp_path, capsys):
    out = tmp_path / "cmp"
    configs = [str(bundled(n)) for n in ("same_dc_pd.yaml", "cross_dc_pd.yaml", "pdd.yaml")]
    args = ["compare", "--no-capacity", "--allow-mixed-slo", *_tiny(tmp_path), "--out", str(out)]
    assert main([*args, *configs]) == 0
    escape = tmp_path / "escape.yaml"
    escape.write_text(bundled("pdd.yaml").read_text().replace("name: pdd", "name: ../../evil"))
    assert main([*args, configs[0], str(escape)]) == 0
    assert not list(tmp_path.rglob("evil*"))               # nothing written outside the folder
    runs = sorted(p.name for p in out.iterdir())
    assert runs == ["1-same_dc_pd", "2-.._.._evil"]        # the third system's run is gone


def _nesting(obj) -> int:
    if isinstance(obj, dict):
        obj = list(obj.values())
    return 1 + max(map(_nesting, obj), default=0) if isinstance(obj, list) else 0


JSON_VALUES = st.recursive(
    st.none() | st.integers() | st.text(alphabet='[]{}"\\ab\n'),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='[]{}"\\a'), inner,
                                                               max_size=3), max_leaves=20)


@given(JSON_VALUES)
def test_the_nesting_checked_before_decoding_is_the_nesting(value):
    # brackets, quotes and backslashes inside strings do not count
    assert _json_depth(json.dumps(value).encode()) == _nesting(value)
