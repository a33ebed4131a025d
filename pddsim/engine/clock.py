"""SimPy's clock and events for the engine's hot paths, without SimPy's interpreted frames.

Compiled code reads `env.now` through SimPy's property (an interpreted call each time), and makes
an event through SimPy's interpreted constructors and `Environment.schedule`. These functions read
the clock's field and push the heap entry SimPy would push (time, priority, event id, event), so a
run is the same event for event (tests/test_clock.py). The event is a `Timer`: what SimPy's loop
and processes read of an event, as a compiled object, where SimPy's events keep their fields in a
dict of their own (the engine makes one per iteration, flow end and arrival).
"""
from __future__ import annotations

from heapq import heappush
from typing import Any, Callable, Final, Iterator

import simpy
from simpy.core import SimTime
from simpy.events import NORMAL, PENDING, URGENT

# held in the compiled module's own slots: names imported from Python modules would be looked up
# in its globals at every call
_PUSH: Final[Callable[[list, tuple], None]] = heappush
_NEXT: Final[Callable[[Iterator[int]], int]] = next
_PENDING: Final[object] = PENDING
_NORMAL: Final[int] = NORMAL
_URGENT: Final[int] = URGENT


class Timer:
    """An event on SimPy's queue with the fields SimPy's loop (`Environment.step`) and a process
    waiting on it (`Process._resume`) read: `callbacks` (None once processed), `_ok`, `_value`.
    Its callbacks are called with it, as SimPy calls them with the event."""

    def __init__(self, env: simpy.Environment, value: Any, ok: bool,
                 then: Callable[[Any], None] | None) -> None:
        self.env = env
        self.callbacks: list[Callable[[Any], None]] | None = [] if then is None else [then]
        self._value = value
        self._ok = ok

    @property
    def value(self) -> Any:
        """The value it was triggered with (SimPy's `Event.value`)."""
        return self._value


def now(env: simpy.Environment) -> float:
    """The simulated time (`env.now`)."""
    return env._now


def value(event: Timer) -> Any:
    """`event.value` of a processed event."""
    return event._value


def _schedule(env: simpy.Environment, event: Timer, priority: int, at: SimTime) -> None:
    _PUSH(env._queue, (at, priority, _NEXT(env._eid), event))


def timeout(env: simpy.Environment, delay: SimTime, value: Any = None,
            then: Callable[[Timer], None] | None = None) -> Timer:
    """`env.timeout(delay, value)`: an event processed `delay` from now with `value`, calling
    `then` first."""
    if delay < 0:
        raise ValueError(f"Negative delay {delay}")
    event = Timer(env, value, True, then)
    _schedule(env, event, _NORMAL, env._now + delay)   # SimPy's sum: an int clock stays an int
    return event


def event(env: simpy.Environment, then: Callable[[Timer], None] | None = None) -> Timer:
    """`env.event()`: an event that waits to be triggered, calling `then` first once it is."""
    return Timer(env, _PENDING, False, then)


def succeed(event: Timer, value: Any = None) -> None:
    """`event.succeed(value)`: processed at this instant, after the events already due now."""
    if event._value is not _PENDING:
        raise RuntimeError(f"{event} has already been triggered")
    event._ok = True
    event._value = value
    _schedule(event.env, event, _NORMAL, event.env._now)


def urgent(env: simpy.Environment, callback: Callable[[Timer], None]) -> Timer:
    """An event that calls `callback` at this instant before the events already due now, as
    SimPy starts a process: the instance's loop starts there, and so does the end of a run cut
    at a boundary that is now (never inside the caller that cut it)."""
    made = Timer(env, None, True, callback)
    _schedule(env, made, _URGENT, env._now)
    return made
