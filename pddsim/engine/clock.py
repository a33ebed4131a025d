"""SimPy's clock and events for the engine's hot paths, without SimPy's interpreted frames.

Compiled code reads `env.now` through SimPy's property (an interpreted call each time), and makes
an event through SimPy's interpreted constructors and `Environment.schedule`. These functions do
what those do in place: read the clock's field, build the same event and push the same heap entry
(time, priority, event id, event), so a run is the same event for event (tests/test_clock.py).
They also make the urgent event the instance's loop resumes from: a plain `Event`, where a
subclass of SimPy's class could not be compiled.
"""
from __future__ import annotations

from heapq import heappush
from typing import Any, Callable, Final, Iterator

import simpy
from simpy.core import SimTime
from simpy.events import NORMAL, PENDING, URGENT, Event, Timeout

# held in the compiled module's own slots: names imported from Python modules would be looked up
# in its globals at every call
_NEW_TIMEOUT: Final[Callable[[type], Any]] = Timeout.__new__
_NEW_EVENT: Final[Callable[[type], Any]] = Event.__new__
_PUSH: Final[Callable[[list, tuple], None]] = heappush
_NEXT: Final[Callable[[Iterator[int]], int]] = next
_NORMAL: Final[int] = NORMAL
_URGENT: Final[int] = URGENT


def now(env: simpy.Environment) -> float:
    """The simulated time (`env.now`)."""
    return env._now


def value(event: Event) -> Any:
    """`event.value` of a processed event (SimPy's property is an interpreted call)."""
    return event._value


def _schedule(env: simpy.Environment, event: Event, priority: int, at: SimTime) -> None:
    _PUSH(env._queue, (at, priority, _NEXT(env._eid), event))


def timeout(env: simpy.Environment, delay: SimTime, value: Any = None) -> Timeout:
    """`env.timeout(delay, value)`: an event processed `delay` from now with `value`."""
    if delay < 0:
        raise ValueError(f"Negative delay {delay}")
    event = _NEW_TIMEOUT(Timeout)
    event.env = env
    event.callbacks = []
    event._value = value
    event._delay = delay
    event._ok = True
    _schedule(env, event, _NORMAL, env._now + delay)   # SimPy's sum: an int clock stays an int
    return event


def event(env: simpy.Environment) -> Event:
    """`env.event()`: an event that waits to be triggered."""
    made = _NEW_EVENT(Event)
    made.env = env
    made.callbacks = []
    return made


def succeed(event: Event, value: Any = None) -> None:
    """`event.succeed(value)`: processed at this instant, after the events already due now."""
    if event._value is not PENDING:
        raise RuntimeError(f"{event} has already been triggered")
    event._ok = True
    event._value = value
    _schedule(event.env, event, _NORMAL, event.env._now)


def urgent(env: simpy.Environment, callback: Callable[[Event], None]) -> Event:
    """An event that calls `callback` at this instant before the events already due now, as
    SimPy starts a process: the instance's loop starts there, and so does the end of a run cut
    at a boundary that is now (never inside the caller that cut it)."""
    made = event(env)
    made._ok = True
    made._value = None
    made.callbacks.append(callback)
    _schedule(env, made, _URGENT, env._now)
    return made
