"""--check-invariants: the bundled scenarios keep every rule, checking changes no result, and each
check fires when its rule is broken on purpose."""
import heapq

import pytest

from pddsim.config import bundled, load_config
from pddsim.engine.invariants import CheckedEnvironment, FlowLog, Invariants
from pddsim.engine.network import Fabric, Link
from pddsim.errors import InvariantError
from pddsim.sim import load_workload, simulate
from pddsim.system.deployment import build

SCENARIOS = ["colocated.yaml", "same_dc_pd.yaml", "cross_dc_pd.yaml", "pdd.yaml",
             "paper/same_dc_pd.yaml", "paper/cross_dc_pd.yaml", "paper/pdd.yaml",
             "faults/same_dc_pd.yaml", "faults/cross_dc_pd.yaml", "faults/pdd.yaml"]
FAULT_TIME_SCALE = 40     # the faults studies' outages, brought inside the shortened runs


def small(name):
    sets = ["workload.horizon_s=60"] if name.startswith("paper/") else ["workload.limit=150"]
    cfg = load_config(bundled(name), sets)
    if cfg.faults is None:
        return cfg
    events = [e.model_copy(update={"start_s": e.start_s / FAULT_TIME_SCALE,
                                   "duration_s": e.duration_s / FAULT_TIME_SCALE})
              for e in cfg.faults.events]
    return cfg.model_copy(update={"faults": cfg.faults.model_copy(update={"events": events})})


@pytest.mark.parametrize("name", SCENARIOS)
def test_bundled_scenarios_keep_every_rule_and_checking_changes_nothing(name):
    cfg = small(name)
    w = load_workload(cfg)
    checked, plain = simulate(cfg, w, check_invariants=True), simulate(cfg, w)
    assert checked.summary == plain.summary
    assert checked.requests.equals(plain.requests)
    if cfg.faults is not None:          # the faults struck within the run
        assert plain.summary["sim_duration_s"] > max(e.start_s for e in cfg.faults.events)


PD = (("prefill", 1), ("decode", 1))


def test_a_completed_request_short_of_tokens_is_caught():
    from pddsim.engine.request import Request
    checks = Invariants(CheckedEnvironment(), [], [], FlowLog())
    req = Request(0, 1000, 50, (), 512, 0.0, "decode")
    req.emit_run(0.1, 49, 0.01)                  # one token short, then the request completes
    with pytest.raises(InvariantError, match="request 0 completed with 49 of 50 output tokens"):
        checks.request_ended(req)


def checked_deployment(cfg):
    """A built deployment of `cfg` under the checks, nothing run on it yet."""
    env, log = CheckedEnvironment(), FlowLog()
    dep = build(env, cfg, seed=0, observer=log)
    instances = [i for members in dep.members.values() for i in members]
    return env, dep, Invariants(env, instances, dep.links, log)


def test_kv_never_given_back_is_caught(make_config):
    env, dep, checks = checked_deployment(make_config(roles=PD))
    checks.at_end({})
    dep.pools["prefill"][0].held += 1000          # KV the P kept after its request left
    with pytest.raises(InvariantError, match=r"prefill0 at the end: 1000 KV tokens in use"):
        checks.at_end({})


def test_kv_over_capacity_is_caught(make_config):
    env, dep, checks = checked_deployment(make_config(roles=PD))
    p = dep.pools["prefill"][0]
    p.held, p.capacity = 1000, 512                # memory shrinks under the prompt it holds
    with pytest.raises(InvariantError, match=r"prefill0 at 0 s: KV pool use 1000 tokens \(held 1000\) "
                                             r"outside \[0, 512\]"):      # at the first event
        env.run()


def test_a_flow_over_its_cap_and_rates_over_capacity_are_caught():
    env, log = CheckedEnvironment(), FlowLog()
    link = Link(env, "wan", 100.0, 0.0, flow_cap_Bps=60.0, observer=log)
    Invariants(env, [], [link], log)
    link.send(1000, lambda: None)
    env.run(until=1)
    link.flow_cap_Bps = 10.0                      # the rate it was given now exceeds the cap
    env.timeout(0.5)                              # an event after which the checks run
    with pytest.raises(InvariantError, match="over its cap"):
        env.run(until=2)
    link.flow_cap_Bps = None
    link._capacity = 30.0                         # less capacity than the rate handed out
    env.timeout(0.5)
    with pytest.raises(InvariantError, match="exceed the 30.0 B/s"):
        env.run(until=3)


def test_a_fabric_port_over_its_capacity_is_caught():
    env, log = CheckedEnvironment(), FlowLog()
    fabric = Fabric(env, "rdma:a", 0.0, observer=log)
    for name in ("p", "d"):
        fabric.attach(name, 100.0)
    Invariants(env, [], [fabric], log)
    fabric.send("p", "d", 1000, lambda: None)
    env.run(until=1)
    fabric.scale = 0.5                            # the rate it was given now exceeds the port
    env.timeout(0.5)
    with pytest.raises(InvariantError, match=r"p/tx at .* over its 50.0 B/s"):
        env.run(until=2)


def test_a_link_carrying_other_than_its_flows_sent_is_caught():
    env, log = CheckedEnvironment(), FlowLog()
    link = Link(env, "rdma:a", 100.0, 0.0, observer=log)
    checks = Invariants(env, [], [link], log)
    link.send(50, lambda: None)
    env.run()
    checks.at_end({})
    link.bytes_carried += 1
    with pytest.raises(InvariantError, match="carried 51.0 bytes, its flows sent 50.0"):
        checks.at_end({})


def test_links_and_fabrics_tell_their_observer_of_every_flow():
    env, log = CheckedEnvironment(), FlowLog()
    link, fabric = Link(env, "wan", 100.0, 0.0, observer=log), Fabric(env, "rdma:a", 0.0, observer=log)
    fabric.attach("p", 100.0)
    fabric.attach("d", 100.0)
    flows = [link.send(50, lambda: None), link.send(0, lambda: None), fabric.send("p", "d", 10, lambda: None)]
    assert log.flows == {"wan": flows[:2], "rdma:a": flows[2:]}


def test_the_clock_going_back_is_caught():
    env = CheckedEnvironment()
    env.run(until=5)
    event = env.event()
    event._ok, event._value = True, None
    heapq.heappush(env._queue, (1.0, 1, 10**9, event))
    with pytest.raises(InvariantError, match="clock went back from 5"):
        env.step()


def test_cli_flag(capsys):
    from pddsim.cli import main
    assert main(["run", str(bundled("pdd.yaml")), "--set", "workload.limit=50", "--check-invariants",
                 "--quiet", "--json"]) == 0
