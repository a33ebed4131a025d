"""An event that fires at the instant it is made, before the events already due then. A module of
its own, never compiled (pddsim.build.COMPILED leaves it out): it subclasses SimPy's Event, a Python
class, and a compiled subclass of it has no instance dict for SimPy's methods to write to."""
from __future__ import annotations

from collections.abc import Callable

import simpy
from simpy.events import URGENT


class Urgent(simpy.Event):
    """Calls `callback` at this instant before the events already due now, as SimPy starts a
    process: the instance's loop starts there, and so does the end of a run cut at a boundary
    that is now (never inside the caller that cut it)."""

    def __init__(self, env: simpy.Environment, callback: Callable[[simpy.Event], None]):
        super().__init__(env)
        self._ok, self._value = True, None
        self.callbacks.append(callback)
        env.schedule(self, URGENT)
