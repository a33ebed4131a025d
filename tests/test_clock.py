"""The engine's clock and timeouts (engine/clock.py) are SimPy's own, event for event: the same
time, the same heap entries, the same order of processing; a `Timer` is processed as SimPy's
event would be, by SimPy's loop and by a process waiting on it."""
import pytest
import simpy
from simpy.events import URGENT

from pddsim.engine import clock


def _entries(env: simpy.Environment) -> list[tuple]:
    """The queue's entries as SimPy orders them, events shown by value, state and callbacks."""
    return [(t, type(t), prio, eid, ev._value, ev._ok, ev.callbacks)
            for t, prio, eid, ev in sorted(env._queue, key=lambda e: e[:3])]


@pytest.mark.parametrize("start", [0, 2.5])
def test_a_timeout_pushes_the_entry_simpys_timeout_pushes(start):
    ours, theirs = simpy.Environment(start), simpy.Environment(start)
    for delay, value in [(1.5, None), (0.0, "x"), (0, "x"), (1e-9, 7), (1.5, None)]:
        clock.timeout(ours, delay, value)
        theirs.timeout(delay, value)
    assert _entries(ours) == _entries(theirs)


def test_timeouts_are_processed_with_simpys_at_their_times_and_in_their_order():
    env = simpy.Environment()
    seen = []
    for i, delay in enumerate([3.0, 1.0, 1.0, 2.0, 0.0]):
        event = clock.timeout(env, delay, i) if i % 2 else env.timeout(delay, i)
        event.callbacks.append(lambda e: seen.append((clock.now(env), e.value)))
    env.run()
    assert seen == [(0.0, 4), (1.0, 1), (1.0, 2), (2.0, 3), (3.0, 0)]
    assert clock.now(env) == env.now == 3.0


def test_a_process_waits_on_a_timer_as_on_simpys_timeout():
    env = simpy.Environment()
    seen = []

    def waiter():
        got = yield clock.timeout(env, 2.0, "late")
        seen.append((env.now, got))
        got = yield env.timeout(1.0, "simpy")
        seen.append((env.now, got))

    env.process(waiter())
    env.run()
    assert seen == [(2.0, "late"), (3.0, "simpy")]


def test_a_timer_calls_its_callback_with_itself_once_processed():
    env = simpy.Environment()
    called = []
    made = clock.timeout(env, 1.0, 5, then=called.append)
    assert made.callbacks == [called.append]
    env.run()
    assert called == [made] and made.callbacks is None and made.value == 5


def test_a_negative_delay_is_refused_as_simpy_refuses_it():
    with pytest.raises(ValueError, match="Negative delay"):
        clock.timeout(simpy.Environment(), -1.0)


@pytest.mark.parametrize("start", [0, 1.0])
def test_a_triggered_event_and_an_urgent_one_are_processed_as_simpys(start):
    """An event succeeded now comes after those already due now, an urgent one before them; the
    queue holds SimPy's entries (an int clock stays an int)."""
    seen: dict[str, list[str]] = {"simpy": [], "clock": []}
    queues = {}
    for make, log in seen.items():
        env = simpy.Environment(start)
        env.timeout(0).callbacks.append(lambda e, log=log: log.append("due"))
        waiting = env.event() if make == "simpy" else clock.event(env)
        waiting.callbacks.append(lambda e, log=log: log.append(f"succeeded {e.value}"))
        if make == "simpy":
            waiting.succeed(3)
            first = env.event()              # as SimPy schedules a process's start
            first._ok, first._value = True, None
            first.callbacks.append(lambda e, log=log: log.append("urgent"))
            env.schedule(first, URGENT)
        else:
            clock.succeed(waiting, 3)
            clock.urgent(env, lambda e, log=log: log.append("urgent"))
        queues[make] = [(t, type(t), prio, eid) for t, prio, eid, _ in sorted(env._queue)]
        env.run()
    assert queues["clock"] == queues["simpy"]
    assert seen["clock"] == seen["simpy"] == ["urgent", "due", "succeeded 3"]


def test_an_event_succeeds_once():
    env = simpy.Environment()
    once = clock.event(env)
    clock.succeed(once)
    with pytest.raises(RuntimeError, match="already been triggered"):
        clock.succeed(once)
