"""Backends: results in item order, a failing call retried, one failing for good recorded with its
reason; a real local Ray cluster gives the same plan and sweep as local processes."""
import os
import sys
from pathlib import Path

import pandas as pd
import pytest
from test_plan import D, P, small_config

from pddsim.experiments.backends import Failed, Processes
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


def test_ray_retries_and_records_failures(ray_backend, tmp_path):
    assert ray_backend.map(flaky, [1, 2, 3], str(tmp_path)) == [1, 4, 9]
    out = ray_backend.map(broken, [1, 2, 3])
    assert out[0] == 1 and out[2] == 3 and out[1] == Failed("ValueError: point 2 cannot be run")
