"""Backends: results in item order, a failing call retried, one failing for good recorded with its
reason; a real local Ray cluster gives the same plan, sweep and map as local processes."""
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from test_pdd_map import two_systems
from test_plan import D, P, small_config

from pddsim.experiments.backends import Failed, Processes
from pddsim.experiments.pdd_map import pdd_map
from pddsim.experiments.plan import plan
from pddsim.experiments.sweep import sweep


def flaky(marker_dir: str, item: int) -> int:
    """Fails on its first call for each item (a marker file remembers across processes)."""
    marker = Path(marker_dir) / f"{item}"
    if not marker.exists():
        marker.write_text("")
        raise RuntimeError(f"transient {item}")
    return item * item


def broken(_, item: int) -> int:
    if item == 2:
        raise ValueError("point 2 cannot be run")
    return item


def crash(marker_dir: str, item: int) -> int:
    """Kills its worker process on the first call of item 1."""
    marker = Path(marker_dir) / "crashed"
    if item == 1 and not marker.exists():
        marker.write_text("")
        os._exit(1)
    return item


@pytest.mark.parametrize("jobs", [1, 2])
def test_retried_then_failed_for_good(tmp_path, jobs):
    done = []
    with Processes(jobs) as backend:
        assert backend.map(flaky, [1, 2, 3], str(tmp_path), lambda i, v: done.append(i)) == [1, 4, 9]
        assert sorted(done) == [0, 1, 2]
        out = backend.map(broken, [1, 2, 3])
    assert out[0] == 1 and out[2] == 3
    assert out[1] == Failed("ValueError: point 2 cannot be run")


def test_a_crashed_worker_is_replaced(tmp_path):
    with Processes(2) as backend:
        assert backend.map(crash, [0, 1, 2, 3], str(tmp_path)) == [0, 1, 2, 3]
    assert (tmp_path / "crashed").exists()      # item 1 did kill its worker, and was run again


@pytest.fixture(scope="module")
def ray_backend():
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])     # workers cannot import tests/
    from pddsim.experiments.backends import Ray
    with Ray(jobs=2) as backend:
        yield backend


def test_ray_gives_the_same_plan_and_sweep(ray_backend, tmp_path):
    path = small_config(tmp_path)
    vary = [f"{P}=1..2", f"{D}=1..2"]
    with Processes(2) as local:
        expected = plan(path, vary, budget=90, seed=0, backend=local)
        table = sweep(path, [f"{D}=1,2"], backend=local)
    assert plan(path, vary, budget=90, seed=0, backend=ray_backend).to_json() == expected.to_json()
    pd.testing.assert_frame_equal(sweep(path, [f"{D}=1,2"], backend=ray_backend), table,
                                  check_exact=True)


def test_ray_gives_the_same_map(ray_backend, tmp_path, make_config):
    grid = (*two_systems(tmp_path, make_config), ("gpu_b_premium", [0, 1]), ("wan_gbps", [5, 10]))
    with Processes(2) as local:
        expected = pdd_map(*grid, backend=local)
    assert pdd_map(*grid, backend=ray_backend) == expected


def test_ray_retries_and_records_failures(ray_backend, tmp_path):
    assert ray_backend.map(flaky, [1, 2, 3], str(tmp_path)) == [1, 4, 9]
    out = ray_backend.map(broken, [1, 2, 3])
    assert out[0] == 1 and out[2] == 3 and out[1] == Failed("ValueError: point 2 cannot be run")


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            todo += [c for c in children if c not in found]
            found.update(children)
    return found


def _listening_addresses(pids: set[int]) -> list[str]:
    """The local addresses (hex, as /proc/net shows them) of the TCP sockets `pids` listen on."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:            # LISTEN
                found.append(fields[1].split(":")[0])
    return found


def _loopback(hex_address: str) -> bool:
    if len(hex_address) == 8:                                         # IPv4, little-endian
        return hex_address[6:] == "7F"
    return (hex_address == "00000000000000000000000001000000"         # ::1
            or hex_address.startswith("0000000000000000FFFF0000") and hex_address[30:] == "7F")


@pytest.mark.skipif(not Path("/proc/net/tcp").is_file(), reason="reads /proc (Linux)")
def test_a_local_ray_listens_on_loopback_only(ray_backend):
    addresses = _listening_addresses(_descendants(os.getpid()))
    assert addresses, "found none of the local Ray's servers"
    assert all(map(_loopback, addresses)), addresses


def test_an_unreachable_ray_address_in_the_environment_fails_fast(tmp_path, input_error):
    # port 9 on loopback: nothing listens, and nothing outside 127.0.0.0/8 is contacted
    pytest.importorskip("ray")
    path = small_config(tmp_path)
    p = subprocess.run([sys.executable, "-m", "pddsim.cli", "sweep", str(path), "--grid",
                        f"{D}=1,2", "--backend", "ray", "--quiet"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "RAY_ADDRESS": "127.0.0.1:9"})
    input_error(p.returncode, p.stderr, "RAY_ADDRESS 127.0.0.1:9", "no Ray cluster reachable")
