"""pddsim: a discrete-event simulator of cross-datacenter PD / PDD LLM serving.

The public API (the README's "Python API" section shows it at work):

* `load_config(path, overrides)` or `Config.model_validate(tree)`: a validated scenario;
* `load_workload(config)`, or a `Workload` of `TraceRequest`s built in code, or the generators
  `poisson(PoissonSpec(...), seed)` and `agent_workload(AgentSpec(...), seed)`;
* `simulate(config, workload, seed) -> Result`: summary, per-request, per-instance and per-session
  tables;
* `InputError`: what bad input raises (one line naming the file and line or the field).

Names resolve on first use, so `import pddsim` (and the command line) stays quick.
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pddsim.config import AgentSpec, Config, PoissonSpec, load_config
    from pddsim.errors import InputError
    from pddsim.sim import Result, load_workload, simulate
    from pddsim.workload.model import TraceRequest, Workload
    from pddsim.workload.synthetic import agent_workload, poisson

_HOME = {
    "Config": "pddsim.config", "load_config": "pddsim.config", "AgentSpec": "pddsim.config",
    "PoissonSpec": "pddsim.config", "InputError": "pddsim.errors",
    "TraceRequest": "pddsim.workload.model", "Workload": "pddsim.workload.model",
    "agent_workload": "pddsim.workload.synthetic", "poisson": "pddsim.workload.synthetic",
    "Result": "pddsim.sim", "load_workload": "pddsim.sim", "simulate": "pddsim.sim",
}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'pddsim' has no attribute {name!r}")
    return getattr(import_module(_HOME[name]), name)
