"""A timeout that can be brought forward or taken back without leaving an event behind.

SimPy cannot unschedule an event: a run's end that a cut moves earlier would stay in its queue
and fire for nothing (about one event in nine of a decode-heavy run). Here the timeout's entry in
the queue is kept, and moving it replaces that entry in place (a heap's decrease-key) with the
key a new timeout scheduled now would get: the same time, priority and next event id, so every
event runs in the order it would have with a new timeout, and the old one is simply gone."""
from __future__ import annotations

from heapq import heapify, heappush

import simpy
from simpy.core import SimTime
from simpy.events import NORMAL, EventPriority

Entry = tuple[SimTime, EventPriority, int, simpy.Event]   # SimPy's queue entry: time, priority, id


def timeout(env: simpy.Environment, delay: float) -> Entry:
    """Schedule a timeout `delay` from now, as `env.timeout(delay)` would; returns its entry (its
    `event` is entry[3])."""
    event = simpy.Event(env)
    event._ok, event._value = True, None      # triggered, as a Timeout is when made
    entry: Entry = (env.now + delay, NORMAL, next(env._eid), event)
    heappush(env._queue, entry)
    return entry


def move(env: simpy.Environment, entry: Entry, delay: float) -> Entry:
    """Move a pending timeout to `delay` from now (usually earlier: a cut run); returns its new
    entry."""
    queue = env._queue
    i = queue.index(entry)                    # identity first: the entry itself is found
    item: Entry = (env.now + delay, NORMAL, next(env._eid), entry[3])
    if item > entry:                          # not earlier (the cut is the run's end): rare
        queue[i] = item
        heapify(queue)
        return item
    while i:                                  # sift the smaller key up toward the root
        parent = (i - 1) >> 1
        if item < queue[parent]:
            queue[i] = queue[parent]
            i = parent
        else:
            break
    queue[i] = item
    return item


def withdraw(env: simpy.Environment, entry: Entry) -> None:
    """Take a pending timeout out of the queue (it will not fire)."""
    queue = env._queue
    queue.remove(entry)
    heapify(queue)
