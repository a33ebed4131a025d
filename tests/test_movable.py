"""Moving a pending timeout in SimPy's queue runs every event in the order that scheduling a new
timeout (and leaving the old one to fire for nothing) runs them, with no event left behind."""

import numpy as np
import simpy

from pddsim.engine import movable


def _run(rng_seed: int, in_place: bool) -> tuple[list[tuple[float, int]], int]:
    """Timeouts on a coarse grid (ties are common), some moved (earlier, later or to the same
    time) or withdrawn while the run goes on; returns the (time, label) order the live ones fired
    in, and how many events fired with nothing to do."""
    rng = np.random.default_rng(rng_seed)
    env = simpy.Environment()
    fired: list[tuple[float, int]] = []
    live: dict[int, object] = {}                # label -> entry (in place) or event (reference)

    def fire(label: int):
        return lambda _e: fired.append((env.now, label))

    def schedule(label: int, delay: float) -> None:
        if in_place:
            entry = movable.timeout(env, delay)
            entry[3].callbacks.append(fire(label))
            live[label] = entry
        else:
            event = env.timeout(delay)
            event.callbacks.append(fire(label))
            live[label] = event

    def move(label: int, delay: float) -> None:
        if in_place:
            live[label] = movable.move(env, live[label], delay)
        else:
            old = live[label]
            callbacks, old.callbacks[:] = list(old.callbacks), []
            event = env.timeout(delay)
            event.callbacks.extend(callbacks)
            live[label] = event

    def withdraw(label: int) -> None:
        if in_place:
            movable.withdraw(env, live.pop(label))
        else:
            live.pop(label).callbacks.clear()

    labels = iter(range(10**6))
    for _ in range(30):
        schedule(next(labels), float(rng.integers(0, 8)) * 0.5)
    idle = 0
    while env._queue:
        empty = not env._queue[0][3].callbacks
        env.step()
        if empty:                          # fired for nothing: the run goes on as if it had not
            idle += 1
            continue
        live = {k: v for k, v in live.items()
                if not (v[3] if in_place else v).processed}
        for _ in range(int(rng.integers(0, 3))):
            what = rng.random()
            if what < 0.4 or not live:
                schedule(next(labels), float(rng.integers(0, 6)) * 0.5)
            else:
                label = int(rng.choice(list(live)))
                if what < 0.9:
                    move(label, float(rng.integers(0, 6)) * 0.5)
                else:
                    withdraw(label)
        if len(fired) > 400:
            break
    return fired, idle


def test_moved_timeouts_fire_in_the_order_new_timeouts_would():
    for seed in range(30):
        ordered, idle = _run(seed, in_place=True)
        reference, left_behind = _run(seed, in_place=False)
        assert ordered == reference
        assert idle == 0 and left_behind > 0
