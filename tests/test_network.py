import pytest
import simpy

from pddsim.engine.network import Link


def _run(link_kwargs, flows, until=100):
    """flows: list of (start_s, nbytes); returns delivery times."""
    env = simpy.Environment()
    link = Link(env, "l", **link_kwargs)
    done = {}

    def starter(i, t, n):
        yield env.timeout(t)
        link.send(n, lambda: done.__setitem__(i, env.now))

    for i, (t, n) in enumerate(flows):
        env.process(starter(i, t, n))
    env.run(until=until)
    return link, done


def test_single_flow_time_is_size_over_bandwidth_plus_latency():
    _, done = _run(dict(bandwidth_Bps=100.0, latency_s=0.5), [(0, 1000)])
    assert done[0] == pytest.approx(10.5)


def test_two_flows_share_the_link_equally():
    # A: 1000 B at t=0, B: 500 B at t=2, 100 B/s. A alone for 2 s (200 B sent), then both at 50 B/s:
    # B finishes after 10 s (t=12); A has 800-500=300 B left alone at 100 B/s -> t=15.
    link, done = _run(dict(bandwidth_Bps=100.0, latency_s=0.0), [(0, 1000), (2, 500)])
    assert done[1] == pytest.approx(12.0)
    assert done[0] == pytest.approx(15.0)
    assert link.bytes_carried == pytest.approx(1500)


def test_per_flow_cap_limits_a_lone_flow():
    _, done = _run(dict(bandwidth_Bps=100.0, latency_s=0.0, flow_cap_Bps=25.0), [(0, 100), (0, 100)])
    assert done[0] == pytest.approx(4.0) and done[1] == pytest.approx(4.0)


def test_cancel_frees_bandwidth_and_counts_sent_bytes():
    env = simpy.Environment()
    link = Link(env, "l", 100.0, 0.0)
    done = {}
    a = link.send(1000, lambda: done.__setitem__("a", env.now))
    link.send(1000, lambda: done.__setitem__("b", env.now))

    def canceller():
        yield env.timeout(4)          # each got 200 B
        link.cancel(a)

    env.process(canceller())
    env.run()
    assert "a" not in done
    assert a.sent == pytest.approx(200)
    assert done["b"] == pytest.approx(4 + 800 / 100)   # full bandwidth after the cancel
    assert link.bytes_carried == pytest.approx(1200)


def test_capacity_change_rescales_the_rest():
    env = simpy.Environment()
    link = Link(env, "l", 100.0, 0.0)
    done = {}
    link.send(1000, lambda: done.__setitem__("a", env.now))

    def squeeze():
        yield env.timeout(5)          # 500 B sent
        link.set_capacity(50.0)

    env.process(squeeze())
    env.run()
    assert done["a"] == pytest.approx(15.0)


def test_processor_sharing_mean_sojourn_matches_mm1_ps():
    """Poisson flows with exponential sizes on a PS link: mean sojourn = E[S] / (1 - rho)."""
    import numpy as np
    rng = np.random.default_rng(1)
    lam, mean_size, bw = 0.8, 1.0, 1.0          # rho = 0.8
    n = 40000
    starts = np.cumsum(rng.exponential(1 / lam, n))
    sizes = rng.exponential(mean_size, n)
    env = simpy.Environment()
    link = Link(env, "l", bw, 0.0)
    sojourn = []

    def source():
        for t, s in zip(starts, sizes):
            yield env.timeout(t - env.now)
            t0 = env.now
            link.send(s, lambda t0=t0: sojourn.append(env.now - t0))

    env.process(source())
    env.run()
    expected = mean_size / bw / (1 - lam * mean_size / bw)   # 5.0
    assert np.mean(sojourn) == pytest.approx(expected, rel=0.08)
