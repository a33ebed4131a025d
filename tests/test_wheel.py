"""`pip install .` (not editable) gives a working `pddsim`: the bundled scenarios and the default
trace ship inside the wheel. Built from a copy of the sources, installed into a fresh venv outside
the repository that borrows this environment's dependencies, run from an unrelated directory. The
wheel is the interpreted build (PDDSIM_PURE=1 at build time): what it ships is the same, and the
compiled engine's results are tests/test_compiled.py's."""
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from site import getsitepackages

import pytest

import pddsim

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "pddsim", "configs", "traces")


def run(*argv, cwd=None) -> subprocess.CompletedProcess:
    """Without PYTHONPATH: the installed package must be what runs, not a checkout on the path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PDDSIM_PURE": "1"}
    return subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True,
                          check=True, env=env)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The `pddsim` script of a fresh venv holding only the wheel (dependencies: this env's)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"          # a clean copy: an in-tree build/ could leak stale modules
    shutil.copytree(ROOT, src, ignore=lambda d, names: [
        n for n in names if Path(d) == ROOT and n not in SOURCES or n == "__pycache__"
        or n.endswith(".so")])
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
        "-w", tmp / "dist", src)
    wheel, = (tmp / "dist").glob("pddsim-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    sources = {f"pddsim/{p.relative_to(ROOT / 'pddsim').as_posix()}"
               for p in (ROOT / "pddsim").rglob("*.py")}
    assert sources <= shipped, f"modules missing from the wheel: {sorted(sources - shipped)}"

    venv = tmp / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel)
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
                .stdout.strip())
    # this env's packages (its own and those it inherits) after the venv's own; a .pth line adds
    # a path, not its .pth files, so an editable install of this checkout stays out of the way
    (site / "deps.pth").write_text("".join(f"{p}\n" for p in getsitepackages()))
    return venv / "bin" / "pddsim"


def test_wheel_runs_the_bundled_scenarios(installed, tmp_path):
    where = run(installed.parent / "python", "-c", "import pddsim; print(pddsim.__file__)",
                cwd=tmp_path).stdout
    assert not where.startswith(str(ROOT))
    run_ = json.loads(run(installed, "run", "--json", "--quiet", "--set", "workload.limit=200",
                          cwd=tmp_path).stdout)
    assert run_["requests_total"] == 200
    compared = json.loads(run(installed, "compare", "--no-capacity", "--json", "--quiet",
                              "--set", "workload.horizon_s=30", cwd=tmp_path).stdout)
    assert [s["system"] for s in compared] == ["paper_same_dc_pd", "paper_cross_dc_pd", "paper_pdd"]


def test_wheel_finds_its_scenarios_by_name_from_anywhere(installed, tmp_path):
    """The README's Python example and bundled scenarios by name, with nothing of the checkout in
    the working directory."""
    python = installed.parent / "python"
    example, *_ = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    printed = run(python, "-c", example, cwd=tmp_path).stdout
    assert "median TTFT" in printed
    for name in ("paper/pdd", "pdd.yaml", "configs/same_dc_pd.yaml"):
        run(installed, "validate", name, cwd=tmp_path)
    listed = run(installed, "configs", "list", cwd=tmp_path).stdout
    assert "paper/pdd" in listed
    assert run(installed, "--version", cwd=tmp_path).stdout.split() == ["pddsim", pddsim.__version__]
