"""The compiled build and the interpreted one give the same results: every bundled scenario (shortened
as the invariant tests shorten them) run in a process of each build, every table and summary figure
compared bit for bit. Skips where the engine is not compiled (no C compiler at install). And no
compiled module defines a class on a base that is not compiled with it (a crash, not an error)."""
import enum
import importlib.util
import inspect
import os
import pickle
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from test_invariants import SCENARIOS

from pddsim.build import COMPILED, compiled

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "pddsim"

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


@pytest.mark.slow
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


def foreign_bases(module_name: str) -> dict[str, list[str]]:
    """The classes `module_name` defines whose MRO holds a class mypyc cannot lay a native class
    over: anything but object, another compiled module's class, and the typing machinery of a
    Protocol; an Enum (which mypyc leaves a Python class) may have its value type and enum's."""
    module = importlib.import_module(module_name)
    found = {}
    for cls in vars(module).values():
        if not inspect.isclass(cls) or cls.__module__ != module_name:
            continue
        allowed = {object, typing.Protocol, typing.Generic}
        bad = [f"{b.__module__}.{b.__qualname__}" for b in cls.__mro__[1:]
               if b not in allowed and b.__module__ not in COMPILED
               and not (issubclass(cls, enum.Enum) and b.__module__ in ("enum", "builtins"))]
        if bad:
            found[cls.__qualname__] = bad
    return found


@pytest.mark.parametrize("module_name", COMPILED)
def test_no_compiled_class_subclasses_a_class_left_interpreted(module_name):
    assert foreign_bases(module_name) == {}


def test_the_check_finds_simpys_subclasses_where_they_live():
    """Not vacuous: the module that subclasses SimPy's environment is found out, and is left out."""
    assert "pddsim.engine.invariants" not in COMPILED
    assert foreign_bases("pddsim.engine.invariants")["CheckedEnvironment"][0].startswith("simpy.")


def test_compiled_is_what_the_build_compiles():
    """Every module listed exists; compiled, each is an extension and no other pddsim module is."""
    modules = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)
               for p in PACKAGE.rglob("*.py")}
    assert set(COMPILED) <= modules
    if not compiled():
        pytest.skip("the engine is not compiled here")
    for name in modules:
        origin = importlib.util.find_spec(name).origin
        assert origin.endswith(".py") == (name not in COMPILED), name
