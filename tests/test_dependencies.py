"""What the code relies on of its dependencies is pinned where it must be."""
import re
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_simpy_has_an_upper_bound_since_its_internals_are_read():
    """engine/daemons.py reads the event queue's length and engine/instance.py triggers an event at
    URGENT priority through SimPy's private fields: a release that renames them must not be taken
    unseen."""
    used = [p.name for p in (ROOT / "pddsim" / "engine").glob("*.py")
            if re.search(r"\._(queue|ok|value)\b", p.read_text())]
    assert used, "no SimPy internals read any more: the upper bound can go"
    spec = re.search(r'"simpy([^"]*)"', (ROOT / "pyproject.toml").read_text())
    assert spec and "<" in spec.group(1), spec
    upper = re.search(r"<\s*([\d.]+)", spec.group(1)).group(1)
    installed = tuple(int(x) for x in version("simpy").split(".")[:2])
    assert installed < tuple(int(x) for x in upper.split("."))
