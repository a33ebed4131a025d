"""Turns a config into live objects: instances per role with their memory and performance model,
an RDMA fabric per cluster (each instance's NICs, the core) and the WAN link between clusters.
Converts config units to SI, once."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np

from pddsim import catalog
from pddsim.config import Config, InstanceGroup, LinkConfig, RdmaConfig
from pddsim.engine.daemons import Daemons
from pddsim.engine.dp_balance import DpBalance
from pddsim.engine.instance import Instance
from pddsim.engine.multi_token import MultiToken
from pddsim.engine.network import Background, Fabric, FabricFlow, Flow, FlowObserver, Link
from pddsim.engine.perf import PERF_MODELS
from pddsim.engine.prefix_cache import PrefixCache
from pddsim.errors import InputError
from pddsim.system.pool import Pool

GBIT = 1e9 / 8


@dataclass
class Group:
    """The instances of one instance group of the config, in order: the first `spec.count` serve
    from the start, the rest (up to its scaling max) are built off. `startup_s`: how long one
    takes to start (see `config.Startup`)."""
    cluster: str
    where: str                              # its config path, for messages
    spec: InstanceGroup
    instances: list[Instance]
    startup_s: float


@dataclass
class Deployment:
    model: catalog.ModelSpec
    pools: dict[str, Pool] = field(default_factory=dict)   # the instances in service, per role
    members: dict[str, list[Instance]] = field(default_factory=dict)   # all built, per role
    groups: list[Group] = field(default_factory=list)
    rdma: dict[str, Fabric] = field(default_factory=dict)
    wan: Link | None = None
    daemons: Daemons | None = None          # the periodic processes of its environment

    def carrier(self, src: Instance, dst: Instance) -> Fabric | Link:
        """What a transfer from `src` to `dst` crosses: their cluster's fabric, or the WAN."""
        return self.rdma[src.cluster] if src.cluster == dst.cluster else self._wan()

    def _wan(self) -> Link:
        assert self.wan is not None, "two clusters have a WAN line (the config requires it)"
        return self.wan

    def send(self, src: Instance, dst: Instance, nbytes: float, on_delivered) -> Flow:
        """Move `nbytes` of KV from `src` to `dst`: over their cluster's fabric, or the WAN."""
        if src.cluster == dst.cluster:
            return self.rdma[src.cluster].send(src, dst, nbytes, on_delivered)
        return self._wan().send(nbytes, on_delivered)

    def cancel(self, src: Instance, dst: Instance, flow: Flow) -> None:
        """Stop a transfer `send` started from `src` to `dst`."""
        if src.cluster == dst.cluster:
            self.rdma[src.cluster].cancel(cast(FabricFlow, flow))
        else:
            self._wan().cancel(flow)

    def expected_transfer_s(self, src: Instance, dst: Instance, nbytes):
        """What `nbytes` from `src` to `dst` take on an idle network."""
        if src.cluster == dst.cluster:
            return self.rdma[src.cluster].expected_transfer_s(src, dst, nbytes)
        return self._wan().expected_transfer_s(nbytes)

    @property
    def links(self) -> list[Link | Fabric]:
        return list(self.rdma.values()) + ([self.wan] if self.wan else [])


def kv_capacity_tokens(cfg: Config, model: catalog.ModelSpec, gpu: catalog.GpuSpec,
                       group: InstanceGroup, engine: catalog.EngineProfile, where: str) -> int:
    """KV tokens an instance of `group` holds: per attention rank, the HBM the engine gives the
    KV (its memory rule, less its activation reserve) after the rank's weights (the non-expert
    ones replicated per rank, the experts spread over all GPUs) and the state kept for each of
    `max_batch` requests (sliding-window KV, linear-attention state), over the KV bytes a token
    takes across the rank's GPUs (replicated where TP exceeds the KV heads)."""
    tp, dp = group.tp, group.dp
    batching = group_batching(cfg, group, engine)
    assert batching.memory_utilization is not None and batching.max_batch is not None
    util = batching.memory_utilization
    hbm = tp * gpu.hbm_gb * 1e9
    weights = model.weight_bytes if dp == 1 else \
        model.shared_weight_bytes + model.weight_bytes_routed * tp / group.gpus
    reserve = tp * engine.activation_gb * 1e9
    free = (hbm * util - weights - reserve if engine.memory_rule == "total"
            else (hbm - weights - reserve) * util)
    per_request = model.window_tokens * model.window_kv_bytes_per_token + model.state_bytes
    free -= per_request * tp / min(tp, model.kv_heads or tp) * batching.max_batch / dp
    block = cfg.batching.kv_block_tokens
    token_bytes = model.kv_bytes_per_token * tp / min(tp, model.kv_heads or tp)
    tokens = dp * (int(free // token_bytes) // block * block)
    if tokens < block:
        raise InputError(
            f"{where}: {model.name} weights ({weights / 1e9:.0f} GB per rank) do not fit in "
            f"{tp} x {gpu.name} ({hbm * util / 1e9:.0f} GB usable) with room for KV cache; raise tp")
    return tokens


def group_batching(cfg: Config, group: InstanceGroup, engine: catalog.EngineProfile):
    """The batching limits of `group`'s instances: the config's, the engine's where it leaves
    them null, the group's own batch cap if it has one; an engine whose attention data-parallel
    ranks schedule apart takes the token budget on each rank (`rank_budget`)."""
    batching = cfg.batching.under(engine)
    update: dict = {} if group.max_batch is None else {"max_batch": group.max_batch}
    if group.dp > 1 and engine.rank_budget:
        assert batching.token_budget is not None     # resolved under the engine
        update["token_budget"] = batching.token_budget * group.dp
    return batching.model_copy(update=update) if update else batching


def cache_size(cfg: Config, model: catalog.ModelSpec, cluster, group, kv_tokens: int,
               where: str) -> tuple[int, str]:
    """The prefix-cache size (tokens; 0: none) of an instance of `group` and its tier. A cache
    larger than its tier is an InputError naming the field; null means all the tier holds."""
    pc = cfg.prefix_cache
    if group.role in ("prefill", "colocated"):
        field, tokens, tier = "prefix_cache.prefill_tokens", pc.prefill_tokens, pc.prefill_tier
    elif group.role == "decode":
        field, tokens, tier = "prefix_cache.decode_tokens", pc.decode_tokens, "hbm"
    else:
        return 0, "hbm"
    if tokens == 0:
        return 0, tier
    kv = model.kv_bytes_per_token
    if tier == "hbm":
        room, what = kv_tokens, f"the KV pool of {where} ({kv_tokens:,} tokens)"
    else:
        host = cluster.host_memory
        if host is None:
            cname = where.split(".")[1]
            raise InputError(f"prefix_cache.prefill_tier: host needs clusters.{cname}.host_memory")
        room = int(host.capacity_gb * 1e9 // kv)
        what = f"the host memory of {where} ({host.capacity_gb:g} GB = {room:,} tokens)"
    if tokens is None:
        return room, tier
    if tokens > room:
        raise InputError(f"{field}: {tokens:,} tokens ({tokens * kv / 1e9:,.0f} GB) exceed {what}")
    return tokens, tier


def make_link(env, name: str, lc: LinkConfig, rng: np.random.Generator,
              daemons: Daemons | None = None, observer: FlowObserver | None = None) -> Link:
    link = Link(env, name, lc.bandwidth_gbps * GBIT, lc.rtt_ms / 2e3,
                None if lc.flow_cap_gbps is None else lc.flow_cap_gbps * GBIT, observer)
    if lc.background is not None:
        b = lc.background
        Background(env, link, mean=b.mean, std=b.std, period_s=b.period_s,
                   correlation=b.correlation, rng=rng, daemons=daemons or Daemons(env))
    return link


def node_Bps(rdma: RdmaConfig, gpu: catalog.GpuSpec) -> float:
    """A node's NIC bandwidth, each direction."""
    gbps = rdma.bandwidth_gbps if rdma.bandwidth_gbps is not None else rdma.gpus_per_node * gpu.nic_gbps
    return gbps * GBIT


def make_fabric(env, name: str, rdma: RdmaConfig, gpu: catalog.GpuSpec,
                instances: list[tuple[Instance, int]], observer: FlowObserver | None = None) -> Fabric:
    """A fabric joining `instances` (each with its tp): an instance's KV leaves through the NICs
    of its own GPUs; an oversubscribed core carries their total divided by the ratio."""
    per_gpu = node_Bps(rdma, gpu) / rdma.gpus_per_node
    total = sum(tp for _, tp in instances) * per_gpu
    fabric = Fabric(env, name, rdma.rtt_ms / 2e3,
                    None if rdma.oversubscription == 1 else total / rdma.oversubscription, observer)
    for inst, tp in instances:
        fabric.attach(inst, tp * per_gpu)
    return fabric


def startup_s(model: catalog.ModelSpec, group: InstanceGroup, gpus_per_node: int) -> float:
    """Seconds from asking for an instance to its serving: the engine's start, then each GPU's
    share of the weights (every attention rank a replica of the non-expert weights, the experts
    spread over all GPUs) loaded over its own host link, or over its node's storage read, which
    the node's GPUs of this instance share."""
    st = group.scaling.startup
    weights = model.weight_bytes if group.dp == 1 else \
        model.shared_weight_bytes * group.dp + model.weight_bytes_routed
    per_gpu = weights / group.gpus
    if st.weights_from == "host":
        load_s = per_gpu / (st.host_gb_per_s * 1e9)
    else:
        load_s = per_gpu * min(group.gpus, gpus_per_node) / (st.storage_gb_per_s * 1e9)
    return st.init_s + load_s


def build(env, cfg: Config, seed: int, tracer=None, observer: FlowObserver | None = None) -> Deployment:
    """The deployment `cfg` describes in `env`; `tracer`: a timeline its instances tell of every
    segment, when one is kept; `observer`: told of every flow on its fabrics and WAN, when one is
    kept (invariant checks)."""
    model = cfg.served_model()
    dep = Deployment(model=model, daemons=Daemons(env))
    for cname, cluster in cfg.clusters.items():
        gpu = cfg.catalog.gpu(cluster.gpu)
        perf_cfg = cluster.perf or cfg.perf        # a cluster of other GPUs needs its own table
        members = []
        for gi, group in enumerate(cluster.instances):
            where = f"clusters.{cname}.instances.{gi}"
            engine = cfg.engine_profile(perf_cfg)
            capacity = kv_capacity_tokens(cfg, model, gpu, group, engine, where)
            perf = PERF_MODELS[perf_cfg.kind].from_config(model, gpu, group.tp, perf_cfg,
                                                          Path(cfg.base_dir), group.dp, group.ep,
                                                          cfg.catalog)
            cache_tokens, tier = cache_size(cfg, model, cluster, group, capacity, where)
            host = cluster.host_memory if tier == "host" else None
            pool = dep.pools.setdefault(group.role, Pool())
            built = dep.members.setdefault(group.role, [])
            instances = []
            for k in range(group.most):
                name = f"{cname}/{group.role}{len(built)}"
                load = None if host is None else Link(env, f"host:{name}", host.load_gb_per_s * 1e9, 0.0)
                spec = perf_cfg.spec_decode         # its own seeded stream of acceptance draws
                multi = None if spec is None else MultiToken(
                    spec, perf, np.random.default_rng([seed, 8, sum(map(len, dep.members.values()))]))
                inst = Instance(env, name, group.role, cname, perf=perf, multi_token=multi,
                                prefill_side=group.role in ("prefill", "colocated"),
                                kv_capacity_tokens=capacity,
                                batching=group_batching(cfg, group, engine),
                                cache=PrefixCache(cache_tokens) if cache_tokens else None,
                                host_load=load, tracer=tracer,
                                kv_bytes_per_token=model.kv_bytes_per_token,
                                scheduler=engine.scheduler, admission=engine.admission,
                                reserve_share=engine.reserve_share,
                                balance=DpBalance.under(engine, group.dp))
                if k < group.count:
                    pool.add(inst)
                else:
                    inst.crash()                # off: its engine loop starts when it does
                built.append(inst)
                instances.append(inst)
                members.append((inst, group.gpus))
            dep.groups.append(Group(cname, where, group, instances,
                                    startup_s(model, group, cluster.rdma.gpus_per_node)))
        dep.rdma[cname] = make_fabric(env, f"rdma:{cname}", cluster.rdma, gpu, members, observer)
    if cfg.wan is not None and len(cfg.clusters) == 2:
        dep.wan = make_link(env, "wan", cfg.wan, np.random.default_rng([seed, 2]), dep.daemons,
                            observer)
    return dep


def check_fits(cfg: Config) -> int:
    """Raise InputError if any instance group cannot hold its model with room for KV, or its
    prefix cache is larger than its memory tier; return the largest KV memory (tokens) of any
    instance: no request longer than that can be served."""
    model = cfg.served_model()
    largest = 0
    for cname, cluster in cfg.clusters.items():
        gpu = cfg.catalog.gpu(cluster.gpu)
        engine = cfg.engine_profile(cluster.perf)
        for gi, group in enumerate(cluster.instances):
            where = f"clusters.{cname}.instances.{gi}"
            tokens = kv_capacity_tokens(cfg, model, gpu, group, engine, where)
            cache_size(cfg, model, cluster, group, tokens, where)
            largest = max(largest, tokens)
    return largest
