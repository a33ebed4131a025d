"""Scenario configuration: YAML validated by typed models with field-precise errors.

Configs speak the units people think in (Gbps, ms, GB); `pddsim.system.deployment` converts them to SI
once.
"""
from __future__ import annotations

import copy
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Sequence

import numpy as np
import yaml
from pydantic import (
    Discriminator,
    Field,
    Tag,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from pddsim import catalog
from pddsim.catalog import Catalog, EngineProfile, ModelSpec
from pddsim.errors import InputError
from pddsim.schema import TOO_MANY_DIGITS, Strict, read_yaml, validated

# what one run may build and generate, so that validating a config bounds what running it allocates
# (ten million instances passed validation, then died of MemoryError at 3.6 GB): far past the
# largest fleet and workload the benchmarks run (1,024 instances, a million requests)
MAX_INSTANCES = 100_000                  # per instance group
MAX_REQUESTS = 10_000_000                # per synthetic workload
MIN_SAMPLE_S = 1e-3                      # sampling period: an engine iteration takes milliseconds
MAX_SAMPLES = 1_000_000                  # time-series samples per series over the trace's span


class BackgroundLoad(Strict):
    """Other traffic on a link: its share of the bandwidth follows an AR(1) process."""

    mean: float = Field(ge=0, lt=1, description="mean share of the bandwidth taken by other traffic")
    std: float = Field(0.0, ge=0, description="standard deviation of that share")
    period_s: float = Field(1.0, gt=0, description="how often the share changes")
    correlation: float = Field(0.8, ge=0, lt=1, description="AR(1) coefficient between periods")


class LinkConfig(Strict):
    bandwidth_gbps: float = Field(gt=0, description="line rate, Gbit/s")
    rtt_ms: float = Field(0.0, ge=0, description="round-trip time; a transfer pays half of it")
    flow_cap_gbps: float | None = Field(None, gt=0, description="cap on one flow (a TCP stream)")
    background: BackgroundLoad | None = None
    price_per_hour: float = Field(0.0, ge=0, description="USD per hour for the line")


class RdmaConfig(Strict):
    """A cluster's RDMA fabric: every instance sends and receives through the NICs of its own GPUs,
    and flows between nodes share the fabric's core when it is oversubscribed."""

    bandwidth_gbps: float | None = Field(
        None, gt=0, description="scale-out NIC bandwidth of one node, each direction, Gbit/s "
        "(null: gpus_per_node x the GPU catalog's per-GPU NIC); an instance of tp GPUs gets "
        "tp / gpus_per_node of it")
    gpus_per_node: int = Field(8, ge=1, description="GPUs in one node (sharing its NICs)")
    oversubscription: float = Field(
        1.0, ge=1, description="the core carries the instances' total NIC bandwidth divided by "
        "this (1: non-blocking, no shared bottleneck)")
    rtt_ms: float = Field(0.0, ge=0, description="round-trip time; a transfer pays half of it")
    price_per_hour: float = Field(0.0, ge=0, description="USD per hour for the fabric")


class Startup(Strict):
    """How long a new instance takes to become useful: the engine's own start (process, CUDA
    graph capture, warm-up) plus its weights loaded from `weights_from`. Defaults, per source:
    host: one PCIe 5.0 x16 link per GPU, 64 GB/s raw, ~50 GB/s achieved (the figure the paper
    configs use for host-tier KV loads); storage: one Gen4 NVMe drive's sequential read (~7 GB/s
    on data-center SSD spec sheets) shared by a node's GPUs, less file-system overhead: 5 GB/s.
    `init_s` is an estimate (graph capture and warm-up of a large MoE engine take tens of
    seconds), not a measurement: set it from your own engine's logs."""

    weights_from: Literal["host", "storage"] = Field(
        "storage", description="host: the checkpoint is in the node's DRAM (page cache); "
        "storage: read from the node's disks or network storage")
    host_gb_per_s: float = Field(50.0, gt=0, description="host DRAM to one GPU's HBM, GB/s")
    storage_gb_per_s: float = Field(5.0, gt=0, description="storage to one node, GB/s (its GPUs "
                                    "share it)")
    init_s: float = Field(60.0, ge=0, description="engine start besides the weights, seconds")


class Scaling(Strict):
    """How many instances of a group serve over time (see docs/elastic.md): `fixed` keeps
    `count`; `schedule` follows counts by hour of day; `reactive` tracks targets on what a
    controller polling the engines sees. Instances beyond `count` are built with the same spec,
    off until the policy asks for them; a new one serves after its start-up, a retiring one
    drains first."""

    policy: Literal["fixed", "schedule", "reactive"] = "fixed"
    min: int = Field(1, ge=1, description="instances held at least")
    max: int | None = Field(None, ge=1, le=1024, description="instances held at most (null: count)")
    schedule: dict[float, int] = Field(
        default_factory=dict, description="schedule: hour of day -> instances from then on "
        "(wrapping around the day); the day lasts `day_s`")
    day_s: float = Field(86400.0, gt=0, description="schedule: the length of a day, seconds "
                         "(shorter compresses one, as the workload's `day_s` does)")
    interval_s: float = Field(30.0, gt=0, description="reactive: the measurement interval")
    cooldown_s: float = Field(300.0, ge=0, description="reactive: no change sooner than this "
                              "after the previous one")
    tolerance: float = Field(0.1, ge=0, lt=1, description="reactive: no change while the "
                             "largest observed/target ratio is within 1 +- this")
    queue_per_instance: float | None = Field(
        None, gt=0, description="reactive target: requests waiting per instance")
    kv_occupancy: float | None = Field(None, gt=0, le=1, description="reactive target: share "
                                       "of the KV pool in use (mean over the group)")
    ttft_s: float | None = Field(None, gt=0, description="reactive target: TTFT of the requests "
                                 "ended in the last interval, at `percentile`")
    tpot_s: float | None = Field(None, gt=0, description="reactive target: TPOT, likewise")
    percentile: float = Field(90.0, gt=0, le=100, description="reactive: of TTFT and TPOT")
    drain_poll_s: float = Field(1.0, gt=0, description="how often a draining instance is "
                                "checked for having finished its work")
    startup: Startup = Startup()

    @model_validator(mode="after")
    def _policy(self):
        if self.policy == "schedule":
            if not self.schedule:
                raise ValueError("policy 'schedule' needs schedule (hour -> count)")
            for hour in self.schedule:
                if not 0 <= hour < 24:
                    raise ValueError(f"schedule: hour {hour:g} is not in [0, 24)")
        elif self.schedule:
            raise ValueError(f"schedule goes with policy 'schedule', not {self.policy!r}")
        targets = (self.queue_per_instance, self.kv_occupancy, self.ttft_s, self.tpot_s)
        if self.policy == "reactive" and all(t is None for t in targets):
            raise ValueError("policy 'reactive' needs a target: queue_per_instance, kv_occupancy, "
                             "ttft_s or tpot_s")
        return self


class InstanceGroup(Strict):
    role: Literal["prefill", "decode", "colocated", "relay"]
    count: int = Field(ge=1, le=MAX_INSTANCES, description="instances at the start")
    tp: int = Field(1, ge=1, description="tensor-parallel GPUs of each attention rank")
    dp: int = Field(1, ge=1, description="attention data-parallel ranks per instance, each with "
                    "its own requests' KV and a replica of the non-expert weights; an instance "
                    "has tp x dp GPUs")
    ep: int = Field(1, ge=1, description="MoE: expert-parallel degree (the routed experts spread "
                    "over ep groups of tp x dp / ep GPUs, tensor-parallel within a group)")
    max_batch: int | None = Field(None, ge=1, description="requests in one iteration at most, "
                                  "for this group (null: batching.max_batch)")
    scaling: Scaling = Field(Scaling(), description="how the count changes over the run")

    @model_validator(mode="after")
    def _layout(self):
        if (self.tp * self.dp) % self.ep:
            raise ValueError(f"ep={self.ep} must divide the instance's tp x dp = {self.tp * self.dp} GPUs")
        sc = self.scaling
        if sc.policy == "fixed" and sc.max not in (None, self.count):
            raise ValueError(f"scaling.max: policy 'fixed' keeps count {self.count}; set a policy "
                             "that changes it")
        if not sc.min <= self.count <= self.most:
            raise ValueError(f"scaling: count {self.count} is not within min {sc.min} and max "
                             f"{self.most}")
        for hour, n in sc.schedule.items():
            if not sc.min <= n <= self.most:
                raise ValueError(f"scaling.schedule: {n} instances at hour {hour:g} are not "
                                 f"within min {sc.min} and max {self.most}")
        return self

    @property
    def most(self) -> int:
        """Instances the group can have at once (built up front, off beyond `count`)."""
        return self.count if self.scaling.max is None else self.scaling.max

    @property
    def gpus(self) -> int:
        return self.tp * self.dp


DEFAULT_ENGINE = "distserve-2024"
# batching limits an engine profile gives defaults for (set in a config's `batching`)
ENGINE_BATCHING = ("token_budget", "prefill_chunk", "max_batch", "memory_utilization", "chunk_packing")

# every engine constant can be overridden in `perf`, validated as the catalog validates it
_OVERRIDES = {name: (f.annotation | None,   # type: ignore[operator]
                     FieldInfo.merge_field_infos(f, default=None, description=f"override: {f.description}"))
              for name, f in catalog.EngineProfile.model_fields.items()
              if name not in ("name", "fitted_to", *ENGINE_BATCHING)}    # batching: see Batching
_EngineOverrides = create_model("_EngineOverrides", __base__=Strict, **_OVERRIDES)  # type: ignore[call-overload]


class SpecDecode(Strict):
    """Multi-token decoding (MTP heads or a draft model): each decode iteration verifies `k`
    proposed tokens per request and keeps them up to the first one rejected, plus the target's
    own token (engine/multi_token.py)."""

    k: int = Field(1, ge=1, le=16, description="tokens proposed per request per iteration")
    acceptance: list[Annotated[float, Field(ge=0, le=1)]] = Field(
        min_length=1, max_length=16, description="per proposed position, the chance it is accepted "
        "given that those before it were (one per position, k of them)")
    draft_cost: float = Field(0.0, ge=0, le=1, description="what proposing one token costs, as a "
                              "share of a one-token decode iteration of the same batch (0: free)")

    @model_validator(mode="after")
    def _valid(self):
        if len(self.acceptance) != self.k:
            raise ValueError(f"acceptance needs one rate per proposed position: {self.k}, "
                             f"got {len(self.acceptance)}")
        return self


class Perf(_EngineOverrides):   # type: ignore[misc, valid-type]
    """The iteration-time model: a roofline under a named serving engine (any of its fields can
    be overridden here), or a table of measured iteration times."""

    kind: Literal["roofline", "table"] = "roofline"
    engine: str = Field(DEFAULT_ENGINE, description="serving engine (pddsim/data/engines.yaml)")
    table: str | None = Field(None, description="CSV of measured iteration times (kind: table)")
    spec_decode: SpecDecode | None = Field(None, description="multi-token decoding (null: one "
                                           "token per request per iteration)")

    @model_validator(mode="after")
    def _valid(self):
        if self.kind == "table" and not self.table:
            raise ValueError("perf.kind 'table' needs perf.table (a CSV path)")
        if self.kind == "table" and self.spec_decode is not None:
            raise ValueError("perf.spec_decode needs kind 'roofline' (a measured table has no "
                             "verify steps)")
        return self

    def overrides(self) -> dict:
        return {k: v for k, v in self.model_dump(include=set(_OVERRIDES)).items() if v is not None}

    def engine_profile(self, known: catalog.Catalog = catalog.BUNDLED) -> catalog.EngineProfile:
        """The named engine (of the config's catalog, `known`) with this config's overrides."""
        return known.engine(self.engine).model_copy(update=self.overrides())

    def unknown_names(self, known: catalog.Catalog) -> str:
        """'' if the engine and the GPUs of a per-GPU host figure are in `known`, else what is
        wrong, naming the field."""
        if self.engine not in known.known("engines"):
            return (f"engine: unknown engine {self.engine!r}; known: "
                    f"{', '.join(sorted(known.known('engines')))}")
        unknown = known.unknown_gpus(self.overrides().get("host_layer_us"))
        return f"host_layer_us: {unknown}" if unknown else ""


class HostMemory(Strict):
    """Host DRAM of one instance (its node) given to a prefix cache, and how fast it loads back."""

    capacity_gb: float = Field(gt=0, description="host memory per instance for cached KV, GB")
    load_gb_per_s: float = Field(gt=0, description="host-to-HBM bandwidth for loading a hit, GB/s")


class Cluster(Strict):
    gpu: str
    rdma: RdmaConfig = RdmaConfig()
    instances: list[InstanceGroup] = Field(min_length=1)
    perf: Perf | None = Field(None, description="this cluster's iteration-time model (default: perf)")
    host_memory: HostMemory | None = Field(None, description="per instance; needed by a host-tier cache")


class Batching(Strict):
    """The engine's batching limits; null takes the serving engine's default (perf.engine)."""

    token_budget: int | None = Field(None, ge=1, description="tokens one iteration may compute "
                                     "(on each attention data-parallel rank, for an engine whose "
                                     "ranks schedule apart: its rank_budget)")
    prefill_chunk: int | None = Field(None, ge=1, description="largest prefill chunk of one request")
    max_batch: int | None = Field(None, ge=1, description="requests in one iteration at most")
    kv_block_tokens: int = Field(16, ge=1, description="paged-KV block size")
    memory_utilization: float | None = Field(
        None, gt=0, le=1, description="share of HBM the server may use (how: the engine's "
        "memory_rule)")
    chunk_packing: Literal["packed", "alone", "whole"] | None = Field(
        None, description="packed: one iteration computes prefill chunks of several requests "
        "up to the token budget; alone: of one request only, so a short tail chunk runs by itself; "
        "whole: whole prompts up to the budget, a prompt split into chunks only when it is first "
        "and does not fit (an engine without chunked prefill)")
    coalesce_decode: bool = Field(
        True, description="advance a batch's identical decode iterations in one step; false steps "
        "one iteration at a time (slower, same results: a check of the optimisation)")

    def under(self, engine: catalog.EngineProfile) -> Batching:
        """These limits with the engine's defaults where they are null."""
        return self.model_copy(update={k: getattr(engine, k) for k in ENGINE_BATCHING
                                       if getattr(self, k) is None})


class PrefixCacheConfig(Strict):
    """Each cache lives in a memory tier: `hbm` shares the instance's KV pool with running
    requests (unused cached blocks are evicted first when they need room), `host` takes the
    cluster's `host_memory` and pays a load time per hit."""

    prefill_tokens: int | None = Field(
        None, ge=0, description="prefix-cache size per prefill/colocated instance, tokens "
        "(0: off, null: all its tier holds)")
    prefill_tier: Literal["hbm", "host"] = Field("hbm", description="where the prefill cache lives")
    decode_tokens: int | None = Field(
        0, ge=0, description="decode-side cache (DRC) per decode instance, in HBM, tokens "
        "(0: off, null: all the KV pool holds)")


class Slo(Strict):
    ttft_s: float = Field(gt=0)
    tpot_s: float = Field(gt=0)
    target: float = Field(0.9, gt=0, le=1, description="share of requests that must meet the SLO")


class PoissonSpec(Strict):
    """Knobs of the Poisson workload: independent requests, lognormal lengths. Every input starts
    with the same `shared_prefix_tokens` (a system prompt); the rest of each input is unique."""

    n_requests: int = Field(ge=1, le=MAX_REQUESTS)
    rate_rps: float = Field(gt=0, description="mean arrivals per second")
    input_mean: float = Field(gt=0, description="mean input tokens")
    output_mean: float = Field(gt=0, description="mean output tokens")
    input_sigma: float = Field(1.0, ge=0, description="lognormal sigma of input tokens")
    output_sigma: float = Field(1.0, ge=0, description="lognormal sigma of output tokens")
    shared_prefix_tokens: int = Field(0, ge=0, description="prompt prefix shared by all requests")
    block_tokens: int = Field(512, ge=1, description="tokens per prefix-hash block")

    @model_validator(mode="after")
    def _prefix_below_mean(self):
        if self.shared_prefix_tokens >= self.input_mean:
            raise ValueError(f"shared_prefix_tokens={self.shared_prefix_tokens} must be below "
                             f"input_mean={self.input_mean:g}")
        return self


class AgentSpec(Strict, frozen=True):
    """Knobs of the Agent workload (`pddsim.workload.synthetic.agent_workload`).

    A session is one task: an LLM call per turn, each re-sending the whole context grown by the
    previous reply and the new tool output or user message. Lengths are lognormal (mean, sigma).
    The defaults give ~75% of requests at >= 95% prefix hit, a mean hit near 90% (PDD.md) and
    contexts of tens of thousands of tokens; for the paper scenario (~64K context, 1K output)
    raise `context_mean` (or `turns_mean`), bound it with `max_context` and set `output_mean`.
    """

    sessions: int = Field(400, ge=1, le=MAX_REQUESTS, description="number of sessions (tasks)")
    session_rate: float = Field(0.1, gt=0, description="sessions started per second (Poisson)")
    turns_mean: float = Field(30.0, ge=1, description="mean LLM calls per session (geometric, >= 1)")
    system_tokens: int = Field(
        4096, ge=0, description="system prompt and tool definitions, shared by all sessions")
    context_mean: float = Field(24000.0, gt=0, description="mean task context sent with a "
                                "session's first call (and after a reset)")
    context_sigma: float = Field(1.0, ge=0, description="lognormal sigma of the task context")
    append_mean: float = Field(500.0, gt=0,
                               description="mean tool-output / user tokens appended per turn")
    append_sigma: float = Field(1.5, ge=0,
                                description="lognormal sigma of appended tokens (heavy tail)")
    long_prob: float = Field(0.06, ge=0, le=1, description="probability per turn of a long tool "
                             "output (file dump)")
    long_mean: float = Field(60000.0, gt=0, description="mean tokens of a long tool output "
                             "(sigma: append_sigma)")
    output_mean: float = Field(400.0, gt=0, description="mean output tokens per call")
    output_sigma: float = Field(1.0, ge=0, description="lognormal sigma of output tokens")
    think_mean: float = Field(20.0, gt=0, description="mean seconds between a reply and the next "
                              "call (tool run or user think time)")
    think_sigma: float = Field(1.5, ge=0, description="lognormal sigma of think time")
    reset_prob: float = Field(0.03, ge=0, le=1, description="probability per turn of a context "
                              "reset or compaction: the call shares only the system prompt")
    max_context: int = Field(131072, ge=0,
                             description="context tokens that trigger a compaction (0: never)")
    service_s: float = Field(3.0, ge=0, description="estimated seconds to first token, for "
                             "open-loop arrivals")
    tpot_s: float = Field(0.03, ge=0, description="estimated seconds per output token, for "
                          "open-loop arrivals")
    block_tokens: int = Field(64, ge=1, description="tokens per prefix-hash block")
    drift: str = Field("", description="schedule 'f:m,f:m,...' scaling reset_prob and long_prob "
                       "by m at fraction f of the trace's duration, linear in between "
                       "(e.g. '0:0.5,1:2'); empty: none")

    diurnal: str = Field("", description="day curve 'h:m,h:m,...': the session start rate is "
                         "session_rate x m at hour h of the day, linear in between and around "
                         "midnight (e.g. '0:0.2,9:1.5,14:1.5,22:0.3'); empty: flat")
    day_s: float = Field(86400.0, gt=0, description="the length of the diurnal day, seconds "
                         "(shorter compresses a day into a shorter run)")

    @field_validator("drift")
    @classmethod
    def _drift_schedule(cls, text: str) -> str:
        parse_drift(text)
        return text

    @field_validator("diurnal")
    @classmethod
    def _day_curve(cls, text: str) -> str:
        parse_diurnal(text)
        return text


def _curve(text: str, knob: str, x: str) -> tuple[np.ndarray, np.ndarray]:
    """'x:m,x:m,...' -> (xs, multipliers); empty text is a constant 1 (at x = 0)."""
    if not text.strip():
        return np.array([0.0]), np.array([1.0])
    try:
        points = [tuple(float(v) for v in item.split(":")) for item in text.split(",")]
        xs, multipliers = (np.array(column) for column in zip(*points))
    except ValueError:
        raise ValueError(f"{knob}={text!r} is not '{x}:multiplier,...'") from None
    if xs.ndim != 1 or np.any(np.diff(xs) <= 0) or xs[0] < 0 or np.any(multipliers < 0):
        raise ValueError(f"{knob}={text!r} needs increasing {x}s from 0 and multipliers >= 0")
    return xs, multipliers


def parse_diurnal(text: str) -> tuple[np.ndarray, np.ndarray]:
    """Day curve 'h:m,...' -> (hours, multipliers), a curve of period 24 h; empty text is a
    constant 1."""
    hours, multipliers = _curve(text, "diurnal", "hour")
    if hours[-1] >= 24 or not np.any(multipliers > 0):
        raise ValueError(f"diurnal={text!r} needs hours in [0, 24) and a multiplier above 0")
    return hours, multipliers


def parse_drift(text: str) -> tuple[np.ndarray, np.ndarray]:
    """Drift schedule 'f:m,...' -> (fractions, multipliers); empty text is a constant 1."""
    fractions, multipliers = _curve(text, "drift", "fraction")
    if fractions[-1] > 1:
        raise ValueError(f"drift={text!r} needs fractions in [0, 1]")
    return fractions, multipliers


class BenchmarkSpec(Strict, frozen=True):
    """Knobs of a fixed-concurrency serving benchmark (the load of vLLM `bench serve
    --max-concurrency`, SGLang `bench_serving`, aiperf / genai-perf `--concurrency`): `concurrency`
    clients, each sending its next request `think_s` after its previous one has finished
    streaming; fixed input and output lengths (optionally jittered), no prefix shared between
    requests. `warmup` requests go first and are left out of the figures; the measured ones start
    only once every warm-up request has ended, all clients at once unless `ramp_s` spreads them."""

    concurrency: int = Field(ge=1, description="clients, each with one request in flight")
    isl: int = Field(ge=1, description="input tokens of every request")
    osl: int = Field(ge=1, description="output tokens of every request")
    requests: int | None = Field(None, ge=1, le=MAX_REQUESTS,
                                 description="measured requests (null: 10 x concurrency)")
    warmup: int | None = Field(None, ge=0, description="warm-up requests before them (null: 2 x "
                               "concurrency, as aiperf's benchmark scripts send)")
    isl_jitter: float = Field(0.0, ge=0, le=1, description="relative standard deviation of the "
                              "input length (normal, at least one token)")
    osl_jitter: float = Field(0.0, ge=0, le=1, description="the same for the output length")
    ramp_s: float = Field(0.0, ge=0, description="the clients of each phase start evenly over "
                          "this many seconds (0: all at once)")
    think_s: float = Field(0.0, ge=0, description="a client's pause between a response's end and "
                           "its next request")
    block_tokens: int = Field(64, ge=1, description="tokens per prefix-hash block")

    @property
    def measured(self) -> int:
        return self.requests if self.requests is not None else 10 * self.concurrency

    @property
    def warmup_requests(self) -> int:
        return self.warmup if self.warmup is not None else 2 * self.concurrency


class BenchmarkSynthetic(Strict):
    kind: Literal["benchmark"]
    knobs: BenchmarkSpec


class PoissonSynthetic(Strict):
    kind: Literal["poisson"] = "poisson"
    knobs: PoissonSpec


class AgentSynthetic(Strict):
    kind: Literal["agent"]
    knobs: AgentSpec = AgentSpec()


def _synthetic_kind(raw: Any) -> str:
    return raw.get("kind", "poisson") if isinstance(raw, dict) else raw.kind


# `kind` picks the generator and so the knobs' model: field-precise errors for either
Synthetic = Annotated[Annotated[PoissonSynthetic, Tag("poisson")] | Annotated[AgentSynthetic, Tag("agent")]
                      | Annotated[BenchmarkSynthetic, Tag("benchmark")],
                      Discriminator(_synthetic_kind)]


class WorkloadConfig(Strict):
    trace: str | None = Field(None, description="trace file or directory (relative to the config)")
    format: Literal["auto", "mooncake", "azure", "native", "agent"] = "auto"
    synthetic: Synthetic | None = None
    limit: int | None = Field(None, ge=1, description="replay only the first N requests")
    max_tokens: int | None = Field(None, ge=2, description="clip input+output to this many tokens")
    shared_prefix: bool = Field(False, description="agent traces: system+tool prompt shared by all sessions")
    replay: Literal["open", "closed"] = "open"
    session_start: Literal["recorded", "poisson", "concurrent"] = "recorded"
    session_rate_rps: float | None = Field(None, gt=0, description="poisson session starts per second")
    concurrent_sessions: int | None = Field(None, ge=1, description="sessions kept in flight")
    time_scale: float = Field(
        1.0, gt=0, description="load factor: sessions start this many times as often (recorded "
        "starts divided by it, a Poisson rate multiplied); open loop also plays each session this "
        "much faster, closed loop keeps think times")
    horizon_s: float | None = Field(
        None, gt=0, description="sessions start as a Poisson process at session_rate_rps for this "
        "many seconds (the offered load, and the capacity search's knob): a synthetic Agent "
        "workload generates them (its sessions and session_rate are ignored), any other workload "
        "is resampled (each start draws one of its sessions, with replacement); two rates share "
        "their sessions, the higher starting them sooner and more of them")

    @model_validator(mode="after")
    def _one_source(self):
        if (self.trace is None) == (self.synthetic is None):
            raise ValueError("give exactly one of workload.trace and workload.synthetic")
        if self.session_start == "poisson" and self.session_rate_rps is None:
            raise ValueError("session_start 'poisson' needs session_rate_rps")
        if self.session_start == "concurrent" and self.concurrent_sessions is None:
            raise ValueError("session_start 'concurrent' needs concurrent_sessions")
        if isinstance(self.synthetic, BenchmarkSynthetic) and (
                self.replay, self.session_start, self.time_scale) != ("open", "recorded", 1.0):
            raise ValueError("a benchmark workload issues its own closed-loop load (its "
                             "concurrency): leave replay, session_start and time_scale unset")
        if self.horizon_s is not None and (
                self.session_rate_rps is None or isinstance(self.synthetic, BenchmarkSynthetic)
                or (self.session_start, self.time_scale) != ("recorded", 1.0)):
            raise ValueError("horizon_s draws the session starts itself: it needs session_rate_rps "
                             "(the start rate) and leaves session_start and time_scale unset; a "
                             "benchmark workload has no sessions to start")
        if self.session_start == "concurrent" and self.replay == "closed" and self.time_scale != 1:
            raise ValueError("time_scale has no effect on closed-loop replay with concurrent "
                             "session starts: the load is concurrent_sessions")
        return self


Router = Literal["cache_affinity", "least_loaded", "round_robin"]


class Policies(Strict):
    prefill_router: Router = Field("cache_affinity", description="picks the prefill instance")
    decode_router: Router = Field(
        "least_loaded", description="picks the decode (MD) instance; cache_affinity keeps a "
        "session on the decoder holding its prefix (DRC alignment), least_loaded does not")
    relay_router: Router = Field("least_loaded", description="picks the relay-decode (RLD) instance")
    offload_above_tokens: int | None = Field(
        None, ge=1, description="selective prefill offload (PD only): a prompt longer than this is "
        "prefilled on the prefill instances of the cluster without decoders (its KV crosses the "
        "WAN), a shorter one beside the decoders; null: any prefill instance")


class AnomalyFilter(Strict):
    """Predict long-input / short-output requests at dispatch and finish them on the RLD."""

    min_input_tokens: int = Field(ge=1)
    max_output_tokens: int = Field(ge=1, description="predicted output at or below this")
    predictor_sigma: float = Field(
        0.0, ge=0, description="lognormal error of the output-length predictor (0: exact)")


class Pdd(Strict):
    """PDD's mechanisms: which path a request takes and how the RLD hands off to the MD."""

    path_policy: Literal["wan_threshold", "oracle", "always_relay", "never_relay",
                         "finish_on_relay"] = "wan_threshold"
    relay_above_s: float = Field(
        1.0, ge=0, description="relay when the WAN delta is expected to take longer than this")
    handoff: Literal["one_shot", "catch_up", "adaptive"] = "adaptive"
    catch_up_tokens: int = Field(64, ge=1, description="backlog above which catch-up hands over "
                                 "in parts; it ends with at most this many tokens left")
    adaptive_rld_load: float = Field(
        0.7, gt=0, le=1, description="adaptive: one-shot when the RLD pool's KV use is above this")
    token_id_bytes: float = Field(
        15.0, gt=0, description="wire bytes per handed-off token ID (100 IDs ~ 1.5 KB, PDD.md 3.3)")
    tpot_estimate_s: float = Field(
        0.03, gt=0, description="decode step the oracle assumes when it predicts RLD finish times")
    anomaly_filter: AnomalyFilter | None = None


class Pricing(Strict):
    """What users pay, USD per million tokens. The defaults are an example, not a quote: they sit
    where published API price lists for 1T-class open models sat in 2025-26, with cached input at
    25% of uncached (PDD.md 5: cached tokens bill at 10-25%)."""
    input_usd_per_m: float = Field(0.60, ge=0, description="uncached input tokens")
    cached_input_usd_per_m: float = Field(0.15, ge=0, description="input tokens served from the "
                                          "prefix cache")
    output_usd_per_m: float = Field(2.50, ge=0, description="output tokens")


class Observe(Strict):
    sample_s: float | None = Field(
        None, ge=0, description="time-series sampling period; null: 1/200 of the trace's span "
        f"as replayed (at least 1 s); 0: off; else at least {MIN_SAMPLE_S:g} s")
    timeline: bool = Field(False, description="keep a Perfetto/Chrome timeline of the run")
    timeline_limit: int = Field(200_000, ge=1, description="timeline events kept at most; the "
                                "rest are counted in the file's metadata")

    @field_validator("sample_s")
    @classmethod
    def _off_or_coarse_enough(cls, v: float | None) -> float | None:
        if v is not None and 0 < v < MIN_SAMPLE_S:
            raise ValueError(f"a sampling period is 0 (off) or at least {MIN_SAMPLE_S:g} s, got {v:g}")
        return v


class LinkFault(Strict):
    """A scheduled fault of a link: `link_down` stops it (flows on it stall, rate 0), and
    `link_degrade` runs it at `factor` of its capacity, from `start_s` for `duration_s`."""

    kind: Literal["link_down", "link_degrade"]
    link: str = Field(description="'wan', or 'rdma:CLUSTER' for a cluster's fabric")
    factor: float | None = Field(None, ge=0, le=1, description="link_degrade: share of the "
                                 "capacity left")
    start_s: float = Field(ge=0)
    duration_s: float | None = Field(ge=0, description="null: it never recovers")

    @model_validator(mode="after")
    def _factor(self):
        if (self.kind == "link_degrade") != (self.factor is not None):
            raise ValueError("factor goes with link_degrade (and only with it)")
        return self


class InstanceFault(Strict):
    """A scheduled loss of instances, named (`instance: a/decode0`) or the first `count` of a role
    in a cluster (all of them by default), from `start_s` for `duration_s`; each restarts with an
    empty cache."""

    kind: Literal["instance_down"]
    instance: str | None = Field(None, description="an instance's name, CLUSTER/ROLEi")
    cluster: str | None = None
    role: Literal["prefill", "decode", "colocated", "relay"] | None = None
    count: int | None = Field(None, ge=1, description="with role: how many (null: all)")
    start_s: float = Field(ge=0)
    duration_s: float | None = Field(ge=0, description="null: it never restarts")

    @model_validator(mode="after")
    def _target(self):
        if (self.instance is None) == (self.role is None or self.cluster is None):
            raise ValueError("give either instance, or cluster and role")
        return self


class RandomFaults(Strict):
    """Independent failures of every instance of a role: up-times and repair times exponential
    with means `mtbf_s` and `mttr_s`, drawn from the run's seed (a stream of their own)."""

    role: Literal["prefill", "decode", "colocated", "relay"]
    mtbf_s: float = Field(gt=0, description="mean time between failures of one instance")
    mttr_s: float = Field(gt=0, description="mean time to repair (restart, empty cache)")


FaultEvent = Annotated[LinkFault | InstanceFault, Field(discriminator="kind")]


class Faults(Strict):
    """What fails during the run, and how the system recovers (see docs/faults.md)."""

    events: list[FaultEvent] = Field(default_factory=list, description="scheduled faults")
    random: list[RandomFaults] = Field(default_factory=list, description="random failures per role")
    transfer_timeout_s: float | None = Field(
        None, gt=0, description="a KV transfer not delivered after this long is abandoned and its "
        "request retried (null: stalled transfers wait for the link)")
    max_retries: int = Field(3, ge=0, description="re-dispatches of one request before it fails")
    degraded: Literal["finish_on_relay", "wait"] = Field(
        "finish_on_relay", description="PDD while the WAN is down: new requests finish on the RLD, "
        "or take their usual path and wait for the line")


class Quant(Strict):
    """How the deployment stores the model, where it differs from the checkpoint's catalog entry
    (an FP8 or NVFP4 build of a BF16 release, FP8 KV beside FP8 weights)."""

    weights: catalog.Dtype | None = Field(None, description="non-expert weights' dtype")
    experts: catalog.Dtype | None = Field(None, description="MoE: routed experts' dtype")
    kv: catalog.Dtype | None = Field(None, description="KV cache dtype")


class Config(Strict):
    name: str
    model: str
    catalog: Catalog = Field(
        default_factory=Catalog, description="GPUs, models and engine profiles of your "
        "own, beside the bundled ones (`--catalog FILE` adds a file's)")
    quant: Quant = Quant()
    clusters: dict[str, Cluster] = Field(min_length=1)
    wan: LinkConfig | None = Field(None, description="the line between the clusters")
    batching: Batching = Batching()
    prefix_cache: PrefixCacheConfig = PrefixCacheConfig()
    slo: Slo
    perf: Perf = Perf()
    gpu_prices: dict[str, Annotated[float, Field(ge=0, allow_inf_nan=False)]] = Field(
        default_factory=dict, description="USD/GPU-hour overrides")
    policies: Policies = Policies()
    pdd: Pdd = Pdd()
    workload: WorkloadConfig
    observe: Observe = Observe()
    pricing: Pricing = Pricing()
    faults: Faults | None = Field(None, description="faults during the run (null: none)")
    seed: int = Field(0, ge=0, description="seeds every random stream of the run")
    base_dir: str = Field(".", description="where relative paths resolve (set by the loader)")

    @model_validator(mode="after")
    def _topology(self):
        roles = {g.role for c in self.clusters.values() for g in c.instances}
        if "colocated" in roles and roles != {"colocated"}:
            raise ValueError("colocated instances cannot be mixed with other roles")
        if "colocated" not in roles and not {"prefill", "decode"} <= roles:
            raise ValueError("a disaggregated system needs prefill and decode instances")
        if "relay" in roles:
            where = {g.role: c for c, cl in self.clusters.items() for g in cl.instances}
            if where["relay"] != where["prefill"] or where["decode"] == where["prefill"]:
                raise ValueError("PDD puts relay instances beside prefill and decode (MD) "
                                 "instances in the other cluster")
        if self.policies.offload_above_tokens is not None and ("relay" in roles or len({
                c for c, cl in self.clusters.items() for g in cl.instances
                if g.role == "prefill"}) < 2):
            raise ValueError("policies.offload_above_tokens needs PD with prefill instances in "
                             "both clusters (those beside the decoders take the short prompts)")
        if len(self.clusters) > 2:
            raise ValueError("at most two clusters (one WAN line) are modelled")
        if len(self.clusters) == 2 and self.wan is None:
            raise ValueError("two clusters need a wan link")
        if self.faults is not None:
            self._check_fault_targets(self.faults)
        return self

    @model_validator(mode="after")
    def _known_names(self):
        """Every GPU, model and engine named is in the bundled catalog or the config's own."""
        known = self.catalog
        if self.model not in known.known("models"):
            raise ValueError(f"model: unknown model {self.model!r}; known: "
                             f"{', '.join(sorted(known.known('models')))}")
        perfs = {"perf": self.perf}
        for cname, cluster in self.clusters.items():
            if cluster.gpu not in known.known("gpus"):
                raise ValueError(f"clusters.{cname}.gpu: unknown GPU {cluster.gpu!r}; known: "
                                 f"{', '.join(sorted(known.known('gpus')))}")
            if cluster.perf is not None:
                perfs[f"clusters.{cname}.perf"] = cluster.perf
        for where, perf in perfs.items():
            wrong = perf.unknown_names(known)
            if wrong:
                raise ValueError(f"{where}.{wrong}")
        return self

    def catalog_used(self) -> list[dict]:
        """The catalog entries this config runs on, each with where it comes from."""
        engines = [self.perf.engine] + [c.perf.engine for c in self.clusters.values() if c.perf]
        used = [("models", self.model), *(("gpus", c.gpu) for c in self.clusters.values()),
                *(("engines", e) for e in engines)]
        return [{"kind": kind, "name": name, "source": self.catalog.source(kind, name)}
                for kind, name in dict.fromkeys(used)]

    def engine_profile(self, perf: Perf | None = None) -> EngineProfile:
        """The engine `perf` (default: the config's) names, from this config's catalog."""
        return (perf or self.perf).engine_profile(self.catalog)

    def instance_names(self) -> dict[str, list[str]]:
        """Every instance's name per `cluster/role` (as the deployment names them)."""
        names: dict[str, list[str]] = {}
        count: dict[str, int] = {}
        for cname, cluster in self.clusters.items():
            for g in cluster.instances:
                pool = names.setdefault(f"{cname}/{g.role}", [])
                for _ in range(g.most):
                    n = count.get(g.role, 0)
                    pool.append(f"{cname}/{g.role}{n}")
                    count[g.role] = n + 1
        return names

    def _check_fault_targets(self, faults: Faults) -> None:
        links = {f"rdma:{c}" for c in self.clusters} | ({"wan"} if len(self.clusters) == 2 else set())
        names = self.instance_names()
        for i, ev in enumerate(faults.events):
            where = f"faults.events.{i}"
            if isinstance(ev, LinkFault) and ev.link not in links:
                raise ValueError(f"{where}.link: no link {ev.link!r}; known: {', '.join(sorted(links))}")
            if isinstance(ev, InstanceFault):
                if ev.instance is not None and not any(ev.instance in p for p in names.values()):
                    raise ValueError(f"{where}.instance: no instance {ev.instance!r}; known: "
                                     f"{', '.join(n for p in names.values() for n in p)}")
                if ev.role is not None and f"{ev.cluster}/{ev.role}" not in names:
                    raise ValueError(f"{where}: cluster {ev.cluster!r} has no {ev.role} instances")
        roles = {g.role for c in self.clusters.values() for g in c.instances}
        for i, rf in enumerate(faults.random):
            if rf.role not in roles:
                raise ValueError(f"faults.random.{i}.role: no {rf.role} instances")

    def served_model(self) -> ModelSpec:
        """The catalog's model as this deployment stores it (`quant`)."""
        return self.catalog.model(self.model).served(**self.quant.model_dump())

    def resolve(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else Path(self.base_dir) / p


def set_dotted(raw: dict, dotted: str, value: Any) -> None:
    """Apply one `--set a.b.0.c=value` override to the raw YAML tree (`a.b+=value`: append to
    the list there, starting one if there is none)."""
    keys = dotted.removesuffix("+").split(".")
    put = _appended if dotted.endswith("+") else lambda _old, new, _where: new
    node = raw
    for i, key in enumerate(keys):
        last = i == len(keys) - 1
        if isinstance(node, list):
            try:
                idx = int(key)
                node[idx]
            except (ValueError, IndexError):
                raise InputError(f"--set {dotted}: {'.'.join(keys[:i])} has no item {key!r}") from None
            if last:
                node[idx] = put(node[idx], value, dotted)
            else:
                node = node[idx]
        elif isinstance(node, dict):
            if last:
                node[key] = put(node.get(key), value, dotted)
            else:
                node = node.setdefault(key, {})
        else:
            raise InputError(f"--set {dotted}: {'.'.join(keys[:i])} is not a mapping")


def _appended(current: Any, value: Any, dotted: str) -> list:
    if current is None:
        return [value]
    if not isinstance(current, list):
        raise InputError(f"--set {dotted}=: {dotted.removesuffix('+')} is not a list")
    return [*current, value]


def parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise InputError(f"--set {text}: expected KEY=VALUE")
    key, value = text.split("=", 1)
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError as e:
        raise InputError(f"--set {text}: value is not valid YAML ({str(e).splitlines()[0]})") from None
    except ValueError:                       # the loader's int() of a number past the digit limit
        raise InputError(f"--set {key.strip()}: {TOO_MANY_DIGITS}") from None


def from_dict(raw: dict, origin: str) -> Config:
    return validated(Config, raw, origin)




def load_config(path: str | Path, overrides: Sequence[str] = (),
                values: Mapping[str, Any] | None = None) -> Config:
    """Read, override (`KEY=VALUE` texts parsed as YAML, then `values` taken literally) and
    validate a scenario: a file, or a bundled scenario by name (`locate`)."""
    path = locate(path)
    raw = read_yaml(path, "config")
    if not isinstance(raw, dict):
        raise InputError(f"{path}: a config is a YAML mapping")
    raw = copy.deepcopy(raw)
    for text in overrides:
        set_dotted(raw, *parse_override(text))
    for key, value in (values or {}).items():
        set_dotted(raw, key, value)
    raw.setdefault("base_dir", str(path.resolve().parent))
    if isinstance(raw.get("catalog"), dict):
        for _kind, _name, fields in catalog.raw_entries(raw["catalog"]):
            fields.setdefault("source", str(path.resolve()))
        raw["catalog"] = catalog.with_files(raw["catalog"], Path(raw["base_dir"]))
    return from_dict(raw, str(path))


def locate(path: str | Path) -> Path:
    """The file a config argument names: the path on disk when there is one, else the bundled
    scenario of that name (`paper/pdd`, `pdd.yaml`, `configs/pdd.yaml`), so an installed package
    finds its own scenarios wherever the user stands."""
    given = Path(path)
    if given.exists() or given.is_absolute():
        return given
    name = given.as_posix().removeprefix("configs/")
    for candidate in (name, f"{name}.yaml"):
        if bundled(candidate).is_file():
            return bundled(candidate)
    raise InputError(f"{path}: no such config file, and no bundled scenario of that name "
                     "(`pddsim configs list` shows them)")


def bundled_scenarios() -> dict[str, Config]:
    """Every bundled scenario by the name `locate` finds it under (golden files and plans, which
    are not scenarios, left out)."""
    root = bundled("")
    files = sorted(p for p in root.rglob("*.yaml") if p.parent.name not in ("golden", "plans"))
    return {p.relative_to(root).with_suffix("").as_posix(): load_config(p) for p in files}


def bundled(relative: str) -> Path:
    """A scenario shipped with the package: `configs/` in the repository, `pddsim.configs` once
    installed (a wheel carries it; its configs find the trace in `pddsim.traces` at the same
    relative path as in the repository)."""
    return Path(str(resources.files("pddsim.configs").joinpath(relative)))


def schema() -> dict:
    return Config.model_json_schema()
