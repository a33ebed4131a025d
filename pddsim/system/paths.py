"""Which PDD route (`pddsim.system.routes.Route`) a request takes once its prefill is done,
chosen by name in the config:

* `p_md`: the KV the MD lacks crosses the WAN and the MD streams (high-hit requests: small delta);
* `p_rld_md`: dual path, the RLD streams while the WAN carries the delta, then hands off;
* `p_rld`: the RLD finishes the request and nothing crosses the WAN (anomalous traffic).
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from pddsim.config import Pdd
from pddsim.engine.network import Link
from pddsim.engine.request import Request
from pddsim.system.routes import Route


class PathPolicy(Protocol):
    """The seam of a path policy (`pdd.path_policy` in the config): the route of a request whose
    prefill is done, from what the MD lacks (bytes) and the WAN it would cross."""

    def __init__(self, cfg: Pdd, rng: np.random.Generator) -> None: ...
    def choose(self, req: Request, lacking_bytes: float, wan: Link) -> Route: ...


class Filtered:
    """What the policies share: the predictive anomaly filter."""

    def __init__(self, cfg: Pdd, rng: np.random.Generator):
        self.cfg = cfg
        self.rng = rng

    def anomalous(self, req) -> bool:
        """The predictive filter: long input, and an output predicted short."""
        f = self.cfg.anomaly_filter
        if f is None or req.input_tokens < f.min_input_tokens:
            return False
        predicted = req.output_tokens
        if f.predictor_sigma > 0:
            predicted *= float(self.rng.lognormal(0.0, f.predictor_sigma))
        return predicted <= f.max_output_tokens


class WanThreshold(Filtered):
    """Relay when the MD's missing KV would take longer than `relay_above_s` to cross at the
    share of the line a new flow gets now: what a real router knows at dispatch."""

    def choose(self, req, lacking_bytes, wan):
        if self.anomalous(req):
            return Route.P_RLD
        slow = wan.expected_transfer_s(lacking_bytes) > self.cfg.relay_above_s
        return Route.P_RLD_MD if slow else Route.P_MD


class Oracle(Filtered):
    """An upper bound: knows the true output length and the bandwidth other traffic leaves now,
    finishes on the RLD whatever ends before its KV would reach the MD."""

    def choose(self, req, lacking_bytes, wan):
        wan_s = wan.expected_transfer_s(lacking_bytes, nominal=False)
        if req.output_tokens * self.cfg.tpot_estimate_s < wan_s:
            return Route.P_RLD
        return Route.P_RLD_MD if wan_s > self.cfg.relay_above_s else Route.P_MD


class AlwaysRelay(Filtered):
    def choose(self, req, lacking_bytes, wan):
        return Route.P_RLD if self.anomalous(req) else Route.P_RLD_MD


class NeverRelay(Filtered):
    """Cross-datacenter PD with the decode-side cache: no latency hiding."""

    def choose(self, req, lacking_bytes, wan):
        return Route.P_MD


class FinishOnRelay(WanThreshold):
    """Ablation the paper warns against: low-hit requests are decoded to the end on the RLD."""

    def choose(self, req, lacking_bytes, wan):
        return Route.P_RLD if super().choose(req, lacking_bytes, wan) != Route.P_MD else Route.P_MD


# name -> policy; the config's Literal is checked against these names (tests/test_registries.py)
PATH_POLICIES: dict[str, type[PathPolicy]] = {
    "wan_threshold": WanThreshold, "oracle": Oracle, "always_relay": AlwaysRelay,
    "never_relay": NeverRelay, "finish_on_relay": FinishOnRelay}
