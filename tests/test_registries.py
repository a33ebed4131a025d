"""One source of truth per policy kind: the names the config schema accepts are exactly the
registered implementations, and every registered class fits its seam's Protocol."""
import inspect
from typing import get_args

import pytest

from pddsim.config import Pdd, Perf, Policies
from pddsim.engine.perf import PERF_MODELS, PerfModel
from pddsim.system.handoff import HANDOFFS, Handoff
from pddsim.system.paths import PATH_POLICIES, PathPolicy
from pddsim.system.routers import ROUTERS, Router


def accepted(model, field: str) -> set[str]:
    return set(get_args(model.model_fields[field].annotation))


@pytest.mark.parametrize("model, field, registry, seam", [
    (Policies, "prefill_router", ROUTERS, Router),
    (Policies, "decode_router", ROUTERS, Router),
    (Policies, "relay_router", ROUTERS, Router),
    (Pdd, "path_policy", PATH_POLICIES, PathPolicy),
    (Pdd, "handoff", HANDOFFS, Handoff),
    (Perf, "kind", PERF_MODELS, PerfModel),
], ids=lambda v: v if isinstance(v, str) else "")
def test_schema_names_are_the_registry(model, field, registry, seam):
    assert accepted(model, field) == set(registry)
    methods = {name for name, _ in inspect.getmembers(seam, inspect.isfunction)
               if not name.startswith("_")}
    for cls in registry.values():
        for name in methods:
            assert callable(getattr(cls, name, None)), f"{cls.__name__} lacks {seam.__name__}.{name}"
