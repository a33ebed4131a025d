"""End-to-end tests of the command line: `pddsim.cli.main` in-process, plus a few real subprocesses
to check exit statuses and that bad input costs the user one line of stderr, never a traceback."""
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pddsim import cli
from pddsim.workload.stats import BUCKETS

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
SAME_DC = str(CONFIGS / "same_dc_pd.yaml")
CROSS_DC = str(CONFIGS / "cross_dc_pd.yaml")
SMALL = ["--quiet", "--set", "workload.limit=300"]
SUMMARY_KEYS = (
    "system", "requests_total", "requests_completed", "requests_failed", "sim_duration_s",
    "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_mean_s", "tpot_p99_s",
    "itl_max_p99_s", "e2e_p50_s", "e2e_p99_s", "slo_attainment", "goodput_rps", "throughput_rps",
    "output_tokens_per_s", "cost_per_hour", "bcr", "prefix_hit_rate", "wan_bytes", "rdma_bytes",
    "provenance",
)
STATS_KEYS = ("requests", "duration_s", "arrival_rate_rps", "hit_rate_mean",
              "hit_rate_token_weighted", "bucket_shares")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---- helpers ----------------------------------------------------------------------------------------

def cli_run(capsys, *argv):
    """Run the CLI in-process; return (exit status, stdout, stderr)."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv) -> dict:
    """`pddsim run --json ...` that must succeed; the summary it printed."""
    code, out, err = cli_run(capsys, "run", *argv, "--json")
    assert code == 0, err
    return json.loads(out)          # fails unless stdout is exactly one JSON document


def summary_of(printed: dict) -> dict:
    """What `run --json` printed, less what produced it."""
    return {k: v for k, v in printed.items() if k != "provenance"}


def run_subprocess(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pddsim.cli", *map(str, argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def mooncake_line(t_ms: int) -> str:
    return json.dumps({"timestamp": t_ms, "input_length": 1024, "output_length": 8,
                       "hash_ids": [1, 2]})


def config_copy(tmp_path: Path, edit) -> Path:
    """same_dc_pd.yaml, edited by `edit(raw)`, written into tmp_path."""
    raw = yaml.safe_load(Path(SAME_DC).read_text())
    edit(raw)
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def agent_trace(tmp_path, capsys):
    """A small synthetic Agent trace written by `trace gen`."""
    def gen(seed=3, name="trace.jsonl", *extra):
        path = tmp_path / name
        code, _, err = cli_run(capsys, "trace", "gen", "--out", path, "--seed", seed,
                               "--sessions", 5, *extra)
        assert code == 0, err
        return path
    return gen


# ---- run -----------------------------------------------------------------------------------------------

def test_run_json_prints_one_summary_with_every_key(capsys):
    summary = run_json(capsys, SAME_DC, *SMALL)
    assert set(SUMMARY_KEYS) <= summary.keys()
    assert summary["system"] == "same_dc_pd"
    assert summary["requests_total"] == 300          # workload.limit took effect
    assert summary["requests_completed"] == summary["requests_total"]
    assert summary["requests_failed"] == 0


def test_run_out_writes_parquet_and_summary(capsys, tmp_path):
    out = tmp_path / "result"
    printed = run_json(capsys, SAME_DC, *SMALL, "--out", out)
    requests = pd.read_parquet(out / "requests.parquet")
    assert len(requests) == printed["requests_total"]
    assert sorted(requests["request"]) == list(range(printed["requests_total"]))
    written = json.loads((out / "summary.json").read_text())
    assert written == summary_of(printed)


def test_run_text_output_by_bucket_table(capsys):
    code, out, _ = cli_run(capsys, "run", SAME_DC, *SMALL, "--by-bucket")
    assert code == 0
    assert "requests_total" in out
    for label in BUCKETS:
        assert label in out


def test_run_by_bucket_with_json_keeps_stdout_one_object(capsys):
    """With --json the bucket table goes to stderr, so stdout stays machine-readable."""
    code, out, err = cli_run(capsys, "run", SAME_DC, *SMALL, "--json", "--by-bucket")
    assert code == 0
    assert "requests_total" in json.loads(out)
    for label in BUCKETS:
        assert label in err and label not in out


def test_same_seed_same_summary_other_seed_differs(capsys):
    """cross_dc_pd has random WAN background load, so the seed matters."""
    first = run_json(capsys, CROSS_DC, *SMALL, "--seed", 1)
    again = run_json(capsys, CROSS_DC, *SMALL, "--seed", 1)
    other = run_json(capsys, CROSS_DC, *SMALL, "--seed", 2)
    assert summary_of(first) == summary_of(again)
    assert summary_of(first) != summary_of(other)


# ---- --set overrides -----------------------------------------------------------------------------------

def test_set_narrower_wan_raises_ttft(capsys):
    base = run_json(capsys, CROSS_DC, *SMALL)
    narrow = run_json(capsys, CROSS_DC, *SMALL, "--set", "wan.bandwidth_gbps=10")
    assert narrow["ttft_p50_s"] > base["ttft_p50_s"]
    assert narrow["wan_bytes"] == pytest.approx(base["wan_bytes"])   # same KV, slower line


@pytest.mark.parametrize("override, named", [
    ("slo.ttft_ms=3", "slo.ttft_ms"),
    ("clusters.a.rdma.speed=1", "clusters.a.rdma.speed"),
    ("batching.nope.deeper=1", "batching.nope"),
    ("clusters.a.instances.5.tp=8", "clusters.a.instances.5.tp"),
    ("workload.limit", "workload.limit"),                  # no '='
])
def test_set_bad_field_is_one_line_naming_it(input_error, capsys, override, named):
    code, out, err = cli_run(capsys, "run", SAME_DC, "--quiet", "--set", override)
    input_error(code, err, named)
    assert out == ""


# ---- config errors -------------------------------------------------------------------------------------

def test_unknown_field_in_config_file(input_error, capsys, tmp_path):
    path = config_copy(tmp_path, lambda raw: raw["batching"].update(token_budgett=4096))
    for command in ("validate", "run"):
        code, _, err = cli_run(capsys, command, path)
        input_error(code, err, str(path), "batching.token_budgett")


@pytest.mark.parametrize("text, says", [
    ("name: [unclosed\nmodel: x\n", "not valid YAML"),
    ("- just\n- a list\n", "YAML mapping"),
])
def test_config_not_a_yaml_mapping(input_error, capsys, tmp_path, text, says):
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    code, _, err = cli_run(capsys, "run", path)
    input_error(code, err, str(path), says)


def test_missing_config_file(input_error, capsys, tmp_path):
    path = tmp_path / "absent.yaml"
    code, _, err = cli_run(capsys, "validate", path)
    input_error(code, err, str(path))


@pytest.mark.parametrize("command", ["validate", "run"])
def test_model_that_does_not_fit_names_the_instance_group(input_error, capsys, command):
    code, out, err = cli_run(capsys, command, SAME_DC, "--set", "clusters.a.instances.0.tp=1",
                             *(["--quiet"] if command == "run" else []))
    input_error(code, err, "clusters.a.instances.0", "raise tp")
    assert out == ""


# ---- validate and schema -------------------------------------------------------------------------------

SCENARIOS = sorted(p for p in CONFIGS.rglob("*.yaml") if not {"golden", "plans"} & set(p.parts))


@pytest.mark.parametrize("config", SCENARIOS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_validate_every_bundled_config(capsys, config):
    code, out, err = cli_run(capsys, "validate", config)
    assert code == 0, err
    assert out.strip().endswith(f"ok ({yaml.safe_load(config.read_text())['name']})")


@pytest.mark.parametrize("config", SCENARIOS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_bundled_agent_sessions_replay_in_closed_loop(config):
    """Open-loop replay would issue turns before the turn they follow has ended, which no agent
    can do (`turns_out_of_order`): a bundled scenario with dependent turns replays closed loop."""
    from pddsim.config import load_config
    from pddsim.sim import load_workload
    cfg = load_config(config)
    if any(r.follows >= 0 for r in load_workload(cfg).requests):
        assert cfg.workload.replay == "closed"


def test_bundled_configs_exist():
    """Guards the glob above against silently validating nothing (golden files are not
    scenarios: `pddsim check` runs them; nor are the planned splits `compare` applies)."""
    assert {"same_dc_pd.yaml", "cross_dc_pd.yaml", "colocated.yaml"} <= \
        {p.name for p in CONFIGS.glob("*.yaml")}


def test_schema_is_json_with_properties(capsys):
    code, out, _ = cli_run(capsys, "schema")
    assert code == 0
    schema = json.loads(out)
    assert {"clusters", "workload", "slo"} <= schema["properties"].keys()


# ---- traces --------------------------------------------------------------------------------------------

def test_trace_gen_is_seeded(agent_trace):
    a = agent_trace(3, "a.jsonl").read_bytes()
    b = agent_trace(3, "b.jsonl").read_bytes()
    c = agent_trace(4, "c.jsonl").read_bytes()
    assert a and a == b
    assert a != c


def test_trace_stats_json(capsys, agent_trace):
    path = agent_trace()
    code, out, _ = cli_run(capsys, "trace", "stats", path, "--json")
    assert code == 0
    stats = json.loads(out)
    assert set(STATS_KEYS) <= stats.keys()
    assert "lru" not in stats
    assert stats["requests"] == len(path.read_text().splitlines())
    assert list(stats["bucket_shares"]) == list(BUCKETS)
    assert sum(stats["bucket_shares"].values()) == pytest.approx(1.0)


def test_trace_stats_lru_and_plot(capsys, agent_trace, tmp_path):
    png = tmp_path / "shares.png"
    code, out, _ = cli_run(capsys, "trace", "stats", agent_trace(), "--json",
                           "--lru-tokens", 20000, "--plot", png)
    assert code == 0
    stats = json.loads(out)
    assert stats["lru"]["capacity_tokens"] == 20000
    assert list(stats["lru"]["bucket_shares"]) == list(BUCKETS)
    # a bounded cache can never beat the unbounded one
    assert stats["lru"]["hit_rate_token_weighted"] <= stats["hit_rate_token_weighted"] + 1e-12
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_run_replays_generated_mooncake_trace(capsys, agent_trace):
    path = agent_trace(3, "m.jsonl", "--format", "mooncake")
    summary = run_json(capsys, SAME_DC, "--quiet", "--trace", path)
    assert summary["requests_total"] == len(path.read_text().splitlines())
    assert summary["requests_completed"] == summary["requests_total"]


@pytest.fixture
def broken_trace(tmp_path) -> Path:
    """A Mooncake JSONL whose third line is cut short."""
    path = tmp_path / "broken.jsonl"
    path.write_text("\n".join([mooncake_line(0), mooncake_line(1000), mooncake_line(2000)[:25],
                               mooncake_line(3000)]) + "\n")
    return path


@pytest.mark.parametrize("argv", [["run", SAME_DC, "--quiet", "--trace"], ["trace", "stats"]],
                         ids=["run", "stats"])
def test_malformed_trace_line_is_named(input_error, capsys, broken_trace, argv):
    code, out, err = cli_run(capsys, *argv, broken_trace)
    input_error(code, err, f"{broken_trace.resolve()}:3")
    assert out == ""


@pytest.mark.parametrize("folder", ["run #1", "a: b"])
def test_run_trace_path_is_taken_literally(capsys, tmp_path, folder):
    path = tmp_path / folder / "t.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(mooncake_line(t) for t in (0, 1000, 2000)) + "\n")
    summary = run_json(capsys, SAME_DC, "--quiet", "--trace", path)
    assert summary["requests_total"] == 3


# ---- argument errors and exit statuses -----------------------------------------------------------------

@pytest.mark.parametrize("argv", [["run", "--nope"], [], ["trace"], ["run", "--seed", "x"]],
                         ids=["unknown-option", "no-command", "no-subcommand", "bad-int"])
def test_usage_error_is_one_line(input_error, capsys, argv):
    code, _, err = cli_run(capsys, *argv)
    input_error(code, err)


def test_internal_error_exits_1_with_one_line(capsys, monkeypatch):
    import pddsim.config

    def broken():
        raise RuntimeError("boom")
    monkeypatch.setattr(pddsim.config, "schema", broken)
    code, out, err = cli_run(capsys, "schema")
    assert code == 1
    assert err.splitlines() == ["pddsim: internal error: RuntimeError: boom "
                                "(--debug shows the traceback)"]
    assert out == ""


@pytest.mark.parametrize("argv", [["--debug", "schema"], ["schema", "--debug"]])
def test_debug_shows_the_traceback_of_an_internal_error(capsys, monkeypatch, argv):
    import pddsim.config

    def broken():
        raise RuntimeError("boom")
    monkeypatch.setattr(pddsim.config, "schema", broken)
    code, _, err = cli_run(capsys, *argv)
    assert code == 1
    assert err.startswith("Traceback") and "in broken" in err
    assert err.splitlines()[-1] == "RuntimeError: boom"


def test_subprocess_usage_error(input_error):
    proc = run_subprocess("run", "--nope")
    assert proc.stdout == ""
    input_error(proc.returncode, proc.stderr, "--nope")


def test_subprocess_malformed_trace(input_error, broken_trace):
    proc = run_subprocess("run", SAME_DC, "--quiet", "--trace", broken_trace)
    assert proc.stdout == ""
    input_error(proc.returncode, proc.stderr, f"{broken_trace.resolve()}:3")



def test_time_scale_with_closed_loop_concurrent_starts_is_rejected(input_error, capsys):
    code, _, err = cli_run(capsys, "validate", SAME_DC, "--set", "workload.replay=closed",
                           "--set", "workload.session_start=concurrent",
                           "--set", "workload.concurrent_sessions=2", "--set", "workload.time_scale=2")
    input_error(code, err, "time_scale", "concurrent_sessions")


# ---- help ------------------------------------------------------------------------------------------

def _subcommands(p, path=()):
    """Every (sub)command's words, nested ones included."""
    import argparse
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name)
                yield from _subcommands(sub, (*path, name))


def test_every_commands_help_ends_with_an_example_that_parses(capsys):
    import shlex
    commands = [(), *_subcommands(cli.parser())]
    assert ("catalog",) in commands and ("trace", "gen") in commands
    for words in commands:
        assert cli.main([*words, "--help"]) == 0
        help_text = capsys.readouterr().out
        assert "\nexample:\n" in help_text, words
        lines = help_text.split("\nexample:\n", 1)[1].splitlines()
        for line in lines:
            for command in line.split("#")[0].split(">")[0].split("&&"):
                argv = shlex.split(command)
                assert argv[0] == "pddsim", line
                cli.parser().parse_args(argv[1:])          # a usage error raises InputError
