"""Shared test fixtures: small deployments built in code, with a linear measured-table performance
model so that iteration times are exact (time = base + per_token * batch_tokens), hand-made
workloads, config files, and the check that bad input costs one stderr line."""
from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import pytest
import yaml
from hypothesis import settings

from pddsim.config import from_dict
from pddsim.workload.model import TraceRequest, Workload

# Property tests draw the same examples on every run, so a red build points at a change, not at a
# lucky draw; `HYPOTHESIS_PROFILE=explore pytest` draws fresh ones (keep what fails as an @example).
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture(autouse=True, scope="session")
def trace_cache_dir(tmp_path_factory):
    """The parsed-trace cache of every test (and of the commands tests run) in a directory of the
    test session's own, never the user's."""
    with pytest.MonkeyPatch.context() as mp:
        directory = tmp_path_factory.mktemp("trace-cache")
        mp.setenv("PDDSIM_CACHE_DIR", str(directory))
        yield directory


def linear_table(path: Path, base: float, per_token: float) -> Path:
    rows = ["phase,tokens,context,time_s"]
    for phase in ("prefill", "decode"):
        for t in (0, 1_000_000):
            for ctx in (0, 10**10):
                rows.append(f"{phase},{t},{ctx},{base + per_token * t}")
    path.write_text("\n".join(rows) + "\n")
    return path


def config(tmp_path: Path, *, roles=(("prefill", 1), ("decode", 1)), base=0.01, per_token=1e-5,
           wan=None, two_clusters=False, roofline=False, **overrides):
    """A one- or two-cluster deployment; `roofline` swaps the linear table for the default model."""
    table = linear_table(tmp_path / "perf.csv", base, per_token)
    groups = [{"role": r[0], "count": r[1], "tp": r[2] if len(r) > 2 else 8} for r in roles]
    raw = {
        "name": "t",
        "model": "llama-3.1-70b",
        "clusters": {"a": {"gpu": "h100-sxm", "rdma": {"bandwidth_gbps": 400}, "instances": groups}},
        "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
        "perf": {} if roofline else {"kind": "table", "table": str(table)},
        "workload": {"trace": "unused.jsonl"},
    }
    if two_clusters:
        pre = [g for g in groups if g["role"] in ("prefill", "relay")]
        dec = [g for g in groups if g["role"] not in ("prefill", "relay")]
        raw["clusters"] = {"a": {"gpu": "h100-sxm", "rdma": {"bandwidth_gbps": 400}, "instances": pre},
                           "b": {"gpu": "h100-sxm", "rdma": {"bandwidth_gbps": 400}, "instances": dec}}
        raw["wan"] = wan or {"bandwidth_gbps": 10, "rtt_ms": 20}
    for key, value in overrides.items():
        node = raw
        *path, last = key.split("__")
        for k in path:
            node = node.setdefault(k, {})
        node[last] = value
    return from_dict(raw, "test")


def workload(*reqs) -> Workload:
    """reqs: (arrival_s, input_tokens, output_tokens[, hash_ids[, block_tokens]])."""
    out = []
    for r in reqs:
        kw = {}
        if len(r) > 3:
            kw["hash_ids"] = tuple(r[3])
        if len(r) > 4:
            kw["block_tokens"] = r[4]
        out.append(TraceRequest(arrival_s=r[0], input_tokens=r[1], output_tokens=r[2], **kw))
    return Workload(out)


def write_config(tmp_path: Path, name: str, roles, rate: float) -> Path:
    """A small config file with a Poisson workload of 300 requests at `rate`."""
    cfg = config(tmp_path, roles=roles).model_dump(exclude={"base_dir"})
    cfg["name"] = name
    cfg["workload"] = {"synthetic": {"kind": "poisson", "knobs": {
        "n_requests": 300, "rate_rps": rate, "input_mean": 3000, "output_mean": 60}}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def assert_input_error(code: int, err: str, *fragments: str) -> None:
    """Exit status 2 and a single stderr line that names each fragment."""
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("pddsim: ")
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture
def make_config(tmp_path):
    """`config(...)` writing its perf table under this test's tmp_path."""
    return partial(config, tmp_path)


@pytest.fixture
def make_workload():
    return workload


@pytest.fixture
def config_file(tmp_path):
    """`write_config(name, roles, rate)` under this test's tmp_path."""
    return partial(write_config, tmp_path)


@pytest.fixture
def perf_table():
    return linear_table


@pytest.fixture
def input_error():
    return assert_input_error
