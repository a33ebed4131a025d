"""Which build runs: the hot modules compiled by mypyc (setup.py builds them where a C compiler
is at hand) or their sources interpreted. PDDSIM_PURE=1 makes this process import every pddsim
module from its source even where a compiled one sits beside it; both give the same results."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

# What setup.py compiles. No class here may subclass a class that is not compiled with it (SimPy's,
# an interpreted module's, the standard library's but Enum's): mypyc gives such a subclass an
# instance layout (its own dict slot) that the base's Python methods and CPython's collector do not
# expect, and runs crashed at random (tests/test_compiled.py checks every class). The module that
# subclasses SimPy's environment is left out.
COMPILED = (
    "pddsim.engine.chain", "pddsim.engine.clock", "pddsim.engine.daemons", "pddsim.engine.instance",
    "pddsim.engine.job", "pddsim.engine.network", "pddsim.engine.perf", "pddsim.engine.prefix_cache",
    "pddsim.engine.request",
    "pddsim.system.deployment", "pddsim.system.faults", "pddsim.system.handoff", "pddsim.system.paths",
    "pddsim.system.pdd", "pddsim.system.pipelines", "pddsim.system.routers", "pddsim.system.routes",
    "pddsim.system.scaling",
    "pddsim.intmath", "pddsim.metrics", "pddsim.workload.replay", "pddsim.sim",
)


class _Sources(importlib.abc.MetaPathFinder):
    """Finds pddsim's modules among source files only."""

    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith("pddsim.") or path is None:
            return None
        for entry in path:
            finder = importlib.machinery.FileFinder(
                entry, (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES))
            spec = finder.find_spec(fullname)
            if spec is not None:
                return spec
        return None


def pure_requested() -> bool:
    return os.environ.get("PDDSIM_PURE", "") not in ("", "0")


def use_sources() -> None:
    """Import pddsim's modules from their sources from now on (before any compiled one is)."""
    if not any(isinstance(f, _Sources) for f in sys.meta_path):
        sys.meta_path.insert(0, _Sources())


def compiled() -> bool:
    """Whether this process runs (or would import) the compiled engine."""
    spec = importlib.util.find_spec("pddsim.sim")
    return spec is not None and spec.origin is not None and not spec.origin.endswith(".py")
