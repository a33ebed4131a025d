from dataclasses import replace
from functools import partial

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from pddsim.engine.daemons import Daemons
from pddsim.engine.invariants import CheckedEnvironment
from pddsim.engine.network import Background, Fabric, Link, normal_draws
from pddsim.sim import simulate
from pddsim.workload.model import TraceTable
from pddsim.workload.synthetic import poisson_workload


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


# -- the fabric: NICs per endpoint, an optional core, max-min fair rates -----------------------

def _fabric_run(nics, flows, core=None, latency_s=0.0, scale=1.0):
    """nics: {endpoint: bytes/s}; flows: (start_s, src, dst, nbytes); returns delivery times."""
    env = simpy.Environment()
    fabric = Fabric(env, "f", latency_s, None if core is None else core * scale)
    for name, bw in nics.items():
        fabric.attach(name, bw * scale)
    done = {}

    def starter(i, t, src, dst, n):
        yield env.timeout(t)
        fabric.send(src, dst, n, lambda: done.__setitem__(i, env.now))

    for i, f in enumerate(flows):
        env.process(starter(i, *f))
    env.run()
    return fabric, done


def test_max_min_rates_over_sender_and_receiver_nics():
    # d0's NIC (4 B/s) is the first bottleneck: a (p0->d0) and c (p1->d0) get 2 each; p0 has 10-2=8
    # left for b (p0->d1). a, c: 20 B at 2 B/s -> t=10; b: 80 B by t=10, its last 20 B alone at
    # p0's 10 B/s -> t=12.
    nics = {"p0": 10.0, "p1": 10.0, "d0": 4.0, "d1": 100.0}
    fabric, done = _fabric_run(nics, [(0, "p0", "d0", 20), (0, "p0", "d1", 100), (0, "p1", "d0", 20)])
    assert done == pytest.approx({0: 10.0, 1: 12.0, 2: 10.0})
    assert fabric.bytes_carried == pytest.approx(140)


def test_max_min_rates_through_an_oversubscribed_core():
    # core 6 B/s shared by all three; d0 (1 B/s) fixes z at 1 first, then the core's 5 B/s left
    # is split 2.5/2.5 between x and y (p1 has 10-1=9 left, not binding). x (25 B) and z (10 B)
    # end at t=10; y has 25 B left, alone at min(p1 10, core 6) -> t=10+25/6.
    nics = {"p0": 10.0, "p1": 10.0, "d0": 1.0, "d1": 100.0}
    _, done = _fabric_run(nics, [(0, "p0", "d1", 25), (0, "p1", "d1", 50), (0, "p1", "d0", 10)],
                          core=6.0)
    assert done == pytest.approx({0: 10.0, 1: 10 + 25 / 6, 2: 10.0})


def test_a_non_blocking_fabric_has_no_shared_bottleneck():
    # disjoint pairs never slow each other, however many there are
    nics = {f"{r}{i}": 10.0 for r in "pd" for i in range(16)}
    _, done = _fabric_run(nics, [(0, f"p{i}", f"d{i}", 50) for i in range(16)], latency_s=0.5)
    assert done == pytest.approx({i: 5.5 for i in range(16)})


def test_one_pair_of_a_fabric_is_the_processor_sharing_link():
    """Flows between one sender and one receiver: delivery times equal the PS link's exactly."""
    import numpy as np
    rng = np.random.default_rng(7)
    flows = [(float(t), float(n)) for t, n in zip(np.cumsum(rng.exponential(1.0, 200)),
                                                  rng.exponential(0.9, 200))]
    _, link_done = _run(dict(bandwidth_Bps=1.0, latency_s=0.1), flows, until=None)
    _, fabric_done = _fabric_run({"p": 1.0, "d": 3.0}, [(t, "p", "d", n) for t, n in flows],
                                 latency_s=0.1)
    assert fabric_done == pytest.approx(link_done, rel=1e-9)


def test_incast_receiver_sojourn_matches_mm1_ps():
    """Poisson flows from many fast senders into one receiver: its NIC is an M/M/1-PS server."""
    import numpy as np
    rng = np.random.default_rng(2)
    lam, mean_size, n = 0.7, 1.0, 20000
    starts = np.cumsum(rng.exponential(1 / lam, n))
    sizes = rng.exponential(mean_size, n)
    senders = rng.integers(0, 8, n)
    nics = {**{f"p{i}": 100.0 for i in range(8)}, "d": 1.0}
    _, done = _fabric_run(nics, [(t, f"p{s}", "d", x) for t, s, x in zip(starts, senders, sizes)])
    sojourn = np.array([done[i] for i in range(n)]) - starts
    assert np.mean(sojourn) == pytest.approx(mean_size / (1 - lam * mean_size), rel=0.08)


def test_scaling_every_capacity_scales_every_rate():
    # k times every capacity: the same allocation k times faster, so every flow ends k times sooner
    nics = {"p0": 10.0, "p1": 7.0, "d0": 4.0, "d1": 9.0}
    flows = [(0, "p0", "d0", 20), (0, "p0", "d1", 100), (0, "p1", "d0", 20), (0, "p1", "d1", 30)]
    _, slow = _fabric_run(nics, flows, core=15.0)
    _, fast = _fabric_run(nics, flows, core=15.0, scale=2.5)
    assert fast == pytest.approx({i: t / 2.5 for i, t in slow.items()})


def test_more_bandwidth_never_slows_a_transfer():
    """Random arrivals into one shared receiver from senders of random speed, at 1x and at a
    random k>1 times every capacity: no transfer ends later. (Across several bottlenecks max-min
    fairness is not monotone flow by flow: a faster link can let one flow take a share another
    flow needed elsewhere; what holds there is the instantaneous scaling above.)"""
    import numpy as np
    for trial in range(200):
        rng = np.random.default_rng(trial)
        n = int(rng.integers(2, 6))
        nics = {**{f"p{i}": float(rng.uniform(1, 10)) for i in range(n)}, "d": float(rng.uniform(1, 10))}
        flows = [(float(rng.uniform(0, 5)), f"p{rng.integers(0, n)}", "d", float(rng.uniform(1, 30)))
                 for _ in range(int(rng.integers(2, 9)))]
        _, base = _fabric_run(nics, flows)
        _, more = _fabric_run(nics, flows, scale=float(rng.uniform(1, 3)))
        assert all(more[i] <= base[i] + 1e-9 for i in base), trial


def test_fabric_cancel_and_scale_free_and_stall_bandwidth():
    env = simpy.Environment()
    fabric = Fabric(env, "f", 0.0)
    for name in ("p", "d"):
        fabric.attach(name, 100.0)
    done = {}
    a = fabric.send("p", "d", 1000, lambda: done.__setitem__("a", env.now))
    fabric.send("p", "d", 1000, lambda: done.__setitem__("b", env.now))

    def events():
        yield env.timeout(4)          # each got 200 B
        fabric.cancel(a)
        yield env.timeout(2)          # b: 400 B
        fabric.set_scale(0.0)         # down: b stalls
        yield env.timeout(10)
        fabric.set_scale(0.5)         # back at half speed: 600 B at 50 B/s

    env.process(events())
    env.run()
    assert "a" not in done and a.sent == pytest.approx(200)
    assert done["b"] == pytest.approx(16 + 600 / 50)
    assert fabric.bytes_carried == pytest.approx(1200)
    assert fabric.busy_s == pytest.approx(28)


def _reallocation_checks(rng) -> int:
    """Random flows among 10 endpoints with random NICs, a third cancelled; after every event (a
    start, an end, a cancel), assert that re-allocating every flow at once changes no rate (bit for
    bit)."""
    env = CheckedEnvironment()
    fabric = Fabric(env, "f", 0.0)
    names = [f"e{i}" for i in range(10)]
    for name in names:
        fabric.attach(name, float(rng.uniform(1.0, 10.0)))
    checks = []

    def whole_reallocation_agrees():
        rates = [f.rate for f in fabric._flows]
        fabric._allocate(list(fabric._flows))
        assert [f.rate for f in fabric._flows] == rates
        checks.append(len(rates))
    env.checks.append(whole_reallocation_agrees)

    def flow(t, src, dst, nbytes, cancel_after):
        yield env.timeout(t)
        f = fabric.send(src, dst, nbytes, lambda: None)
        if cancel_after is not None:
            yield env.timeout(cancel_after)
            fabric.cancel(f)

    for _ in range(40):
        src, dst = rng.choice(names, 2, replace=False)
        env.process(flow(float(rng.uniform(0, 20)), src, dst, float(rng.uniform(1, 50)),
                         float(rng.uniform(0, 5)) if rng.random() < 0.3 else None))
    env.run()
    return len(checks)


def test_reallocating_the_group_a_change_touches_gives_the_rates_of_a_whole_reallocation():
    rng = np.random.default_rng(11)
    assert sum(_reallocation_checks(rng) for _ in range(15)) > 1000


def _steps_to_deliver(net, flows, max_events=10_000):
    """Run `flows` [(start_s, nbytes)] through `net` (a Link, or a Fabric between two endpoints);
    the delivery times, or a failure once `max_events` events have not delivered them all (a
    livelock: time stops advancing while events loop)."""
    env = net.env
    done = {}

    def start(i, n):
        send = net.send if isinstance(net, Link) else partial(net.send, "a", "b")
        send(n, lambda: done.__setitem__(i, env.now))

    for i, (t, n) in enumerate(flows):
        env.timeout(t).callbacks.append(lambda _, i=i, n=n: start(i, n))
    for _ in range(max_events):
        if env.peek() == float("inf"):
            break
        env.step()
    else:
        pytest.fail(f"{len(flows) - len(done)} of {len(flows)} flows still in flight after "
                    f"{max_events} events at t={env.now}")
    return done


def test_a_one_token_transfer_late_in_a_run_completes():
    # The review's reproducer: one request of a 1-token prompt arriving at 777 s on the bundled
    # cross-DC deployment looped forever; its 46,080-byte KV on the WAN (70% of 100 Gb/s, 25 Gb/s
    # per flow) left a rest of bytes the clock could not resolve.
    link = Link(simpy.Environment(), "wan", 12.5e9, 0.01, flow_cap_Bps=3.125e9)
    link.set_capacity(0.7 * 12.5e9)
    done = _steps_to_deliver(link, [(777.0, 46080.0)])
    assert done[0] == pytest.approx(777.0 + 46080 / 3.125e9 + 0.01)


def _network(kind, bandwidth):
    env = simpy.Environment()
    if kind == "link":
        return Link(env, "l", bandwidth, 0.0)
    fabric = Fabric(env, "f", 0.0)
    fabric.attach("a", bandwidth)
    fabric.attach("b", bandwidth)
    return fabric


@settings(max_examples=150, deadline=2000)
@given(kind=st.sampled_from(["link", "fabric"]),
       bandwidth=st.floats(1.0, 1e13),
       flows=st.lists(st.tuples(st.floats(0.0, 1e9), st.floats(1e-3, 1e15)), min_size=1, max_size=6))
def test_every_transfer_completes_in_finite_events_at_any_size_and_time(kind, bandwidth, flows):
    done = _steps_to_deliver(_network(kind, bandwidth), flows)
    assert len(done) == len(flows)
    for i, (t, n) in enumerate(flows):   # no flow ends before it could have at the whole bandwidth
        assert done[i] >= t + n / bandwidth * (1 - 1e-9)


@pytest.mark.parametrize("kind", ["link", "fabric"])
def test_an_empty_transfer_on_a_line_without_latency_arrives_after_its_send_returns(kind):
    """No callback runs inside its caller: an empty flow over a line without latency arrives at
    the same instant, but from an event of its own (it was called back inside `send`)."""
    env = simpy.Environment()
    arrived = []
    if kind == "link":
        Link(env, "l", 100.0, 0.0).send(0, lambda: arrived.append(env.now))
    else:
        fabric = Fabric(env, "f", 0.0)
        fabric.attach("a", 100.0)
        fabric.attach("b", 100.0)
        fabric.send("a", "b", 0, lambda: arrived.append(env.now))
    assert arrived == []
    env.run()
    assert arrived == [0.0]


# ---- background load ------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", [0.0, 1e-3, 0.2 * np.sqrt(1 - 0.9 ** 2), 1.0, 37.5])
@pytest.mark.parametrize("per_draw", [1, 7, 256])
def test_batched_normal_draws_are_the_one_by_one_draws(scale, per_draw):
    one_by_one = np.random.default_rng([3, 2])
    want = [one_by_one.normal(0.0, scale) for _ in range(600)]
    draws = normal_draws(np.random.default_rng([3, 2]), scale, per_draw)
    got = [next(draws) for _ in range(600)]
    assert got == want and {type(x) for x in got} == {float}


def _ar1(mean, std, corr, seed, n):
    """The AR(1) written out, one draw per period: the load during each of the first n periods."""
    rng, load, loads = np.random.default_rng(seed), mean, []
    for _ in range(n):
        loads.append(load)
        load = min(max(mean + corr * (load - mean) + rng.normal(0.0, std * np.sqrt(1 - corr ** 2)), 0.0),
                   0.95)
    return loads


@pytest.mark.parametrize("flows", [False, True])
def test_background_load_is_the_ar1_of_one_draw_per_tick(flows):
    """The capacity seen mid-period, period by period, is that of the AR(1) written out with one
    draw per period, bit for bit (past the 256 values of a batch): on an idle line, whose ticks
    are applied only when it is looked at, and on one that flows start on now and then."""
    mean, std, corr, period = 0.3, 0.2, 0.9, 0.5
    env = simpy.Environment()
    link = Link(env, "wan", 1e9, 0.01)
    seen = []

    def watch():
        yield env.timeout(period / 2)
        while True:
            seen.append(link.capacity_Bps)
            if flows and len(seen) % 37 == 0:
                link.send(3e8, lambda: None)
            yield env.timeout(period)

    Background(env, link, mean=mean, std=std, period_s=period, correlation=corr,
                   rng=np.random.default_rng(11), daemons=Daemons(env))
    env.process(watch())
    env.run(until=600 * period)
    assert seen == [link.bandwidth_Bps * (1.0 - load) for load in _ar1(mean, std, corr, 11, 600)]


def test_an_idle_line_schedules_no_background_ticks():
    """Ten thousand periods with one flow: the ticks run as events only while it is in flight."""
    env = simpy.Environment()
    link = Link(env, "wan", 1e9, 0.01)
    Background(env, link, mean=0.3, std=0.2, period_s=1.0, correlation=0.9,
                   rng=np.random.default_rng(1), daemons=Daemons(env))
    env.timeout(5000.5).callbacks.append(lambda _e: link.send(2e9, lambda: None))   # ~3 s at 0.7 GB/s
    env.timeout(20_000)                     # the run is not over (only daemons left would end it)
    events = 0
    while env.peek() < 10_000:
        env.step()
        events += 1
    assert events < 20                      # not one a period: ~10 around the flow
    env.run(until=10_000.5)                 # the line looked at again, 10,000 ticks on
    assert link.capacity_Bps == link.bandwidth_Bps * (1.0 - _ar1(0.3, 0.2, 0.9, 1, 10_001)[-1])

@pytest.mark.parametrize("period_s", [0.5, 2.0])
@pytest.mark.parametrize("sample_s", [0.5, 1.0, 2.0, 3.0, 4.0])
@pytest.mark.parametrize("roles,pdd", [((("prefill", 1), ("decode", 1)), None),
                                       ((("prefill", 1), ("relay", 1), ("decode", 1)),
                                        {"path_policy": "oracle"})])
def test_a_lazy_background_gives_the_run_a_tick_per_period_gives(make_config, period_s, sample_s,
                                                                 roles, pdd):
    """A run whose WAN is often idle, against the same run with the ticks forced every period (a
    stuck handler installed: see Background): the same requests, time series and summary,
    with the sampler's ticks on the WAN's and between them, arrivals on whole seconds, and a
    router that reads what the background leaves."""
    overrides = {"observe__sample_s": sample_s}
    if pdd is not None:
        overrides["pdd"] = pdd
    cfg = make_config(roles=roles, two_clusters=True, **overrides,
                      wan={"bandwidth_gbps": 10, "rtt_ms": 20,
                           "background": {"mean": 0.3, "std": 0.2, "period_s": period_s}})
    w = poisson_workload(60, 0.2, 3000, 40, seed=4)
    w.requests = TraceTable.of(replace(r, arrival_s=float(round(r.arrival_s))) for r in w.requests)

    def always_tick(env, dep, _pipeline):
        dep.daemons.stuck = env.event()

    built = []
    lazy = simulate(cfg, w, on_built=lambda _env, dep, _pipeline: built.append(dep))
    ticking = simulate(cfg, w, on_built=always_tick)
    assert not built[0].wan.background.exact          # it went idle and was re-armed
    assert lazy.requests.equals(ticking.requests)
    assert lazy.timeseries.equals(ticking.timeseries)
    drop = {"wall_s"}
    assert {k: v for k, v in lazy.summary.items() if k not in drop} == \
        {k: v for k, v in ticking.summary.items() if k not in drop}
