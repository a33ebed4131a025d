"""The folder tree is the architecture: a lower layer never imports a higher one."""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pddsim"

# Each layer may import itself and the layers listed before it.
LAYERS = [
    {"errors", "intmath", "version", "build", "schema", "catalog", "config"},
    {"engine"},
    {"workload"},
    {"system"},
    {"cost", "metrics", "sessions", "stationary", "timeline", "timeseries", "provenance", "sim"},
    {"experiments", "report"},
    {"cli", "__init__"},
]


def layer_of(name: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if name in layer)


def runtime_nodes(tree: ast.AST):
    """Every node but those under `if TYPE_CHECKING:` (annotations only, never imported at run time)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            continue
        yield node
        yield from runtime_nodes(node)


def imported_units(path: Path) -> set[str]:
    units = set()
    for node in runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pddsim"):
            parts = node.module.split(".")
            if len(parts) > 1:
                units.add(parts[1])
            else:
                units.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            units.update(a.name.split(".")[1] for a in node.names
                         if a.name.startswith("pddsim."))
    return units


MODULES = sorted(p for p in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_upward_import(path):
    rel = path.relative_to(PACKAGE)
    unit = rel.parts[0] if len(rel.parts) > 1 else rel.stem
    own = layer_of(unit)
    for imported in imported_units(path):
        assert layer_of(imported) <= own, \
            f"{rel} (layer {own}) imports {imported} (layer {layer_of(imported)})"


def test_the_engine_speaks_no_system_vocabulary():
    """The stages of a request's path and the routes are the systems' words (system/stages.py,
    system/routes.py): no string literal in engine/ names one, but for the engine's own two
    stages (a prompt computed, a preempted decoder recomputing) and "decode", also the name of
    an iteration's phase in the performance model."""
    from pddsim.engine.request import PREFILL, RECOMPUTE
    from pddsim.system.routes import Route
    from pddsim.system.stages import STAGES
    words = (set(STAGES) - {PREFILL, RECOMPUTE, "decode"}) | {str(r) for r in Route}
    for path in sorted((PACKAGE / "engine").glob("*.py")):
        literals = {node.value for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.Constant) and isinstance(node.value, str)}
        assert not literals & words, f"engine/{path.name} names {sorted(literals & words)}"
