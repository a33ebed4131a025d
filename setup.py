"""The hot modules (the engine, the systems, the recorder, the replay, `simulate`) compile with
mypyc when it and a C compiler are at hand, about twice as fast; otherwise, or with PDDSIM_PURE=1,
the same sources install interpreted. Both give the same results (tests/test_compiled.py)."""
import importlib.util
import os
import shutil
import sysconfig

from setuptools import setup


def compiled_sources() -> list:
    """pddsim.build's COMPILED as files, read without importing the package being built."""
    spec = importlib.util.spec_from_file_location("pddsim_build", "pddsim/build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return [name.replace(".", "/") + ".py" for name in build.COMPILED]


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
    return mypycify(compiled_sources(), opt_level="3")


setup(ext_modules=compiled_modules())
