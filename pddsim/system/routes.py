"""The routes a request can take through a system: the systems' vocabulary, not the engine's (an
instance serves jobs, whatever path their request takes)."""
from __future__ import annotations

from enum import Enum


class Route(str, Enum):
    """The path a request's KV and stream take through the system (its `pipeline` in outputs)."""

    COLOCATED = "colocated"    # prefill and decode on one instance
    P_D = "p_d"                # PD: prefill, then the decode instance streams
    P_MD = "p_md"              # PDD: the KV the MD lacks crosses the WAN, the MD streams
    P_RLD_MD = "p_rld_md"      # PDD dual path: the RLD streams while the WAN carries the delta
    P_RLD = "p_rld"            # PDD: the RLD finishes the request, nothing crosses the WAN

    def __str__(self) -> str:
        return self.value
