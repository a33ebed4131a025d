"""The result cache cannot mislead: its key moves with everything a result depends on, an edited or
damaged entry is a miss (said once), a cache that cannot be written leaves the results standing,
and the workers of a sweep die with it."""
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pddsim import catalog
from pddsim.experiments import result_cache as result_cache_module
from pddsim.experiments import sweep as sweep_module
from pddsim.experiments.backends import Processes
from pddsim.experiments.result_cache import ResultCache
from pddsim.experiments.sweep import sweep

GRID = ["clusters.a.instances.0.count=1,2"]


@pytest.fixture
def tiny(config_file):
    return config_file("tiny", (("colocated", 1),), 8)


def _key(cfg):
    return ResultCache.key("t", cfg, "w", 0)


def test_the_key_moves_with_the_measured_table_the_config_names(make_config):
    cfg = make_config()
    before = _key(cfg)
    table = Path(cfg.perf.table)
    table.write_text(table.read_text().replace("decode,0,0,", "decode,0,0,1"))
    assert _key(cfg) != before


def test_the_key_moves_with_the_catalog_entries_used(make_config):
    """The entries the config runs on, its own catalog's included: a GPU or model of the user's
    whose numbers change is a new key, though every name stays the same."""
    cfg = make_config()
    before = _key(cfg)
    gpu, model = cfg.clusters["a"].gpu, cfg.model

    def own(kind, name, field, delta):
        fields = catalog.BUNDLED.known(kind)[name].model_dump(exclude={"name"})
        fields[field] += delta
        raw = cfg.model_dump(mode="json", exclude={"base_dir"})
        raw["catalog"] = {kind: {name: {**fields, "override": True}}}
        return type(cfg).model_validate({**raw, "base_dir": cfg.base_dir})

    assert _key(own("gpus", gpu, "hbm_gb", 1)) != before
    assert _key(own("gpus", gpu, "hbm_gb", 1)) != _key(own("gpus", gpu, "hbm_gb", 2))
    assert _key(own("models", model, "layers", 1)) != before


def test_the_key_moves_with_the_simulator_source(make_config, monkeypatch):
    cfg = make_config()
    before = _key(cfg)
    monkeypatch.setattr(result_cache_module, "source_digest", lambda: "another build")
    assert _key(cfg) != before


@pytest.mark.parametrize("edit", [
    lambda e: {},
    lambda e: [],
    lambda e: {**e, "value": {**e["value"], "ttft_p50_s": 0.0431}},
    lambda e: {**e, "key": "another"},
    lambda e: e["value"],                                  # an entry of the old format
])
def test_an_edited_entry_is_a_miss_said_once(tmp_path, capsys, edit):
    cache = ResultCache(tmp_path)
    cache.put("k", {"ttft_p50_s": 0.1816})
    assert cache.get("k") == {"ttft_p50_s": 0.1816}
    path = tmp_path / "k.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    assert cache.get("k") is None and cache.get("k") is None
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "k.json" in err[0] and "warning" in err[0]


def test_a_damaged_entry_is_a_miss(tmp_path, capsys):
    cache = ResultCache(tmp_path)
    (tmp_path / "k.json").write_bytes(b"\xff{")
    assert cache.get("k") is None
    assert "k.json" in capsys.readouterr().err


def test_a_cache_that_cannot_be_written_leaves_the_results_standing(tiny, tmp_path, capsys,
                                                                    monkeypatch):
    runs = []
    real = sweep_module._run_point

    def counting(shared, cfg):
        runs.append(cfg.clusters["a"].instances[0].count)
        return real(shared, cfg)

    def full(*_args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(sweep_module, "_run_point", counting)
    monkeypatch.setattr(result_cache_module.os, "replace", full)
    cache = ResultCache(tmp_path / "cache")
    table = sweep(tiny, GRID, backend=Processes(1), cache=cache)
    assert runs == [1, 2]                                  # each point once, no retries
    assert (table["failed"] == 0).all() and table["requests_completed"].notna().all()
    assert not list((tmp_path / "cache").iterdir())         # no .tmp left behind
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "cannot keep results" in err[0]


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_the_workers_of_a_killed_sweep_die_with_it(tiny, tmp_path):
    args = [sys.executable, "-m", "pddsim.cli", "sweep", str(tiny), "--grid",
            "workload.synthetic.knobs.n_requests=3000,3001,3002,3003", "--jobs", "2", "--quiet"]
    child = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        workers: list[int] = []
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
            workers = [w for w in _children(child.pid) if _alive(w)]
        assert len(workers) >= 2, "the sweep never started its workers"
        time.sleep(1.0)                                    # workers busy simulating
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    deadline = time.monotonic() + 15
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [w for w in workers if _alive(w)]
    for w in left:                                         # do not leave them to the machine
        os.kill(w, signal.SIGKILL)
    assert not left, f"workers {left} outlived their sweep"

