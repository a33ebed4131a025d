"""Backends: where a batch of independent runs executes, local worker processes or a Ray cluster.

Plans and sweeps hand `Backend.map` a module-level function and a list of items; each call is
`fn(shared, item)`, so it ships by name and the shared data (a workload) once per batch. Results
come back in item order whatever finished first, so no table depends on the backend or the number
of workers (`simulate` has no globals). A call that raises is retried; one that fails for good
comes back as a `Failed` carrying its reason, never dropped. `workers` says how many calls run at
once (a plan fills idle ones with work ahead).
"""
from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit

from pddsim.errors import InputError

RETRIES = 2          # further attempts after a call's first failure
WATCH_S = 0.5        # how often a worker checks that its parent still runs


@dataclass(frozen=True)
class Failed:
    """A call that failed on every attempt."""
    reason: str


def _reason(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".splitlines()[0]


class Processes:
    """Local worker processes (`jobs`, default one per CPU; 1 runs in this process). A crashed
    worker breaks the pool: it is rebuilt and the unfinished calls are tried again."""

    def __init__(self, jobs: int | None = None):
        if jobs is not None and jobs < 1:
            raise InputError(f"--jobs {jobs}: must be at least 1")
        self.workers = jobs or os.cpu_count() or 1
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def map(self, fn: Callable, items: list, shared: Any = None,
            on_done: Callable[[int, Any], None] | None = None) -> list:
        results: list = [None] * len(items)
        attempts = [0] * len(items)

        def settle(i: int, value) -> None:
            results[i] = value
            if on_done is not None:
                on_done(i, value)

        def failed(i: int, error: BaseException) -> bool:
            attempts[i] += 1
            if attempts[i] > RETRIES:
                settle(i, Failed(_reason(error)))
                return False
            return True

        if self.workers == 1 or len(items) <= 1:
            for i, item in enumerate(items):
                while True:
                    try:
                        settle(i, fn(shared, item))
                        break
                    except Exception as e:
                        if not failed(i, e):
                            break
            return results

        todo = list(range(len(items)))
        while todo:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(self.workers, initializer=_die_with,
                                                 initargs=(os.getpid(),))
            running = {self._pool.submit(fn, shared, items[i]): i for i in todo}
            todo = []
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    i = running.pop(future)
                    try:
                        settle(i, future.result())
                    except BrokenProcessPool as e:
                        self._pool = None                  # rebuilt before the retry
                        if failed(i, e):
                            todo.append(i)
                    except Exception as e:
                        if failed(i, e):
                            if self._pool is not None:
                                running[self._pool.submit(fn, shared, items[i])] = i
                            else:
                                todo.append(i)
        return results


def _die_with(parent: int) -> None:
    """In a worker: end when the process that started it is gone (killed with SIGKILL, it cannot
    stop its pool, and its workers would live on holding their memory)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_S)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def _call(fn: Callable, shared: Any, item: Any):
    return fn(shared, item)


def _import_simulator() -> None:
    import pddsim.sim  # noqa: F401


class Ray:
    """Ray core tasks: a local Ray instance with `jobs` CPUs when no address is given, else the
    cluster at `address`. Ray retries a task whose worker died and (`retry_exceptions`) one that
    raised."""

    def __init__(self, address: str | None = None, jobs: int | None = None):
        try:
            import ray
        except ImportError:
            raise InputError("--backend ray: Ray is not installed (pip install 'pddsim[ray]')") from None
        if jobs is not None and jobs < 1:
            raise InputError(f"--jobs {jobs}: must be at least 1")
        if address:
            _check_reachable(address)
        self._ray = ray
        ray.init(address=address, num_cpus=None if address else jobs, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
        self._task = ray.remote(max_retries=RETRIES, retry_exceptions=True)(_call)
        # a worker imports the simulator on its first task (seconds): done here, once per CPU,
        # so that cost is part of starting the cluster, as on a long-lived one, not the points'
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        ray.get([ray.remote(_import_simulator).remote() for _ in range(self.workers)])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._ray.shutdown()

    def map(self, fn: Callable, items: list, shared: Any = None,
            on_done: Callable[[int, Any], None] | None = None) -> list:
        ray = self._ray
        shared_ref = ray.put(shared)
        pending = {self._task.remote(fn, shared_ref, item): i for i, item in enumerate(items)}
        results: list = [None] * len(items)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                i = pending.pop(ref)
                try:
                    value = ray.get(ref)
                except Exception as e:                # RayTaskError wraps the task's own error
                    value = Failed(_reason(getattr(e, "cause", None) or e))
                results[i] = value
                if on_done is not None:
                    on_done(i, value)
        return results


def _check_reachable(address: str, timeout_s: float = 3.0) -> None:
    """Fail fast with one line: `ray.init` would otherwise retry an unreachable head for minutes."""
    parts = urlsplit(address if "://" in address else f"ray://{address}")
    try:
        port = parts.port or 6379
        if not parts.hostname:
            raise ValueError("no host")
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except ValueError as e:
        raise InputError(f"--address {address}: expected HOST:PORT ({e})") from None
    except OSError as e:
        raise InputError(f"--address {address}: no Ray cluster reachable "
                         f"({e.strerror or type(e).__name__})") from None


def open_backend(name: str = "processes", *, jobs: int | None = None, address: str | None = None):
    """The backend `--backend NAME` names; `--address` only means something to Ray."""
    if name == "ray":
        return Ray(address, jobs)
    if address:
        raise InputError("--address: only with --backend ray")
    return Processes(jobs)
