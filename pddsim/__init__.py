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

from pddsim.build import pure_requested, use_sources
from pddsim.version import __version__ as __version__

if pure_requested():        # PDDSIM_PURE=1: the interpreted build, even where a compiled one is
    use_sources()

if TYPE_CHECKING:  # `X as X`: re-exported
    from pddsim.config import AgentSpec as AgentSpec
    from pddsim.config import Config as Config
    from pddsim.config import PoissonSpec as PoissonSpec
    from pddsim.config import load_config as load_config
    from pddsim.errors import InputError as InputError
    from pddsim.sim import Result as Result
    from pddsim.sim import load_workload as load_workload
    from pddsim.sim import simulate as simulate
    from pddsim.workload.model import TraceRequest as TraceRequest
    from pddsim.workload.model import Workload as Workload
    from pddsim.workload.synthetic import agent_workload as agent_workload
    from pddsim.workload.synthetic import poisson as poisson

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
