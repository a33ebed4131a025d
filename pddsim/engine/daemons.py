"""Processes that would tick forever (a link's background load, the sampler, random failures
waiting for the next one). They must not keep a run alive: a run in which nothing but them is
scheduled can make no more progress, and has to end rather than tick on (a transfer stalled on a
line that never comes back, say)."""
from __future__ import annotations

from typing import Callable

from pddsim.engine import clock


class Daemons:
    """The periodic processes of one environment, so each can tell when only they are left."""

    def __init__(self, env):
        self.env = env
        self.sleeping = 0          # daemon timeouts scheduled and not yet processed
        self.stuck = None          # an event the run waits on, when it handles a stuck run itself

    def sleep(self, delay: float, then: Callable[[clock.Timer], None] | None = None) -> clock.Timer:
        """A daemon's timeout, calling `then` when it fires: it does not count as progress."""
        self.sleeping += 1
        timer = clock.timeout(self.env, delay, then=self._woke)
        if then is not None:
            callbacks = timer.callbacks
            assert callbacks is not None, "just made: not processed yet"
            callbacks.append(then)
        return timer

    def _woke(self, _event) -> None:
        self.sleeping -= 1

    def keep_going(self) -> bool:
        """Asked by a daemon after each tick. When nothing but daemons is scheduled the run is
        stuck: the run's `stuck` event fires (it ends or fails what cannot progress, and the
        daemons go on) or, when no one handles that, the daemon stops, so SimPy ends the run with
        its error instead of ticking forever."""
        if len(self.env._queue) > self.sleeping:   # SimPy's event queue: anything else pending
            return True
        if self.stuck is None:
            return False
        if not self.stuck.triggered:
            self.stuck.succeed()
        return True
