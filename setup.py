"""The hot modules (the engine, the systems, the recorder, the replay, `simulate`) compile with
mypyc when it and a C compiler are at hand, about twice as fast; otherwise, or with PDDSIM_PURE=1,
the same sources install interpreted. Both give the same results (tests/test_compiled.py)."""
import os
import shutil
import sysconfig

from setuptools import setup

COMPILED = [
    "pddsim/engine/daemons.py", "pddsim/engine/instance.py", "pddsim/engine/invariants.py",
    "pddsim/engine/job.py", "pddsim/engine/network.py", "pddsim/engine/prefix_cache.py",
    "pddsim/engine/request.py",
    "pddsim/system/deployment.py", "pddsim/system/faults.py", "pddsim/system/handoff.py",
    "pddsim/system/paths.py", "pddsim/system/pdd.py", "pddsim/system/pipelines.py",
    "pddsim/system/routers.py", "pddsim/system/routes.py", "pddsim/system/scaling.py",
    "pddsim/metrics.py", "pddsim/workload/replay.py", "pddsim/sim.py",
]


def compiled_modules() -> list:
    if os.environ.get("PDDSIM_PURE", "") not in ("", "0"):
        return []
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        print(f"pddsim: no C compiler ({compiler}): installing the interpreted build")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("pddsim: mypyc is not installed: installing the interpreted build")
        return []
    return mypycify(COMPILED, opt_level="3")


setup(ext_modules=compiled_modules())
