"""GPU and model catalogs: data files shipped with the package, validated on load."""
from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Annotated

import yaml
from pydantic import AfterValidator, Field, NonNegativeFloat, model_validator

from pddsim.errors import InputError
from pddsim.schema import M, Strict

DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


class GpuSpec(Strict, frozen=True):
    """The four dimensions that decide which phase a chip suits, plus its NIC and price."""

    name: str
    bf16_tflops: float = Field(gt=0, description="peak dense BF16 TFLOPS")
    fp8_tflops: float = Field(gt=0, description="peak dense FP8 TFLOPS (= BF16 where FP8 is unsupported)")
    hbm_gb: float = Field(gt=0, description="HBM capacity, GB (1e9 bytes)")
    hbm_tbps: float = Field(gt=0, description="HBM bandwidth, TB/s")
    interconnect_gbps: float = Field(
        gt=0, description="intra-node GPU-GPU bandwidth per GPU and direction (unidirectional), GB/s")
    allreduce_bus_gbps: float = Field(
        gt=0, description="bus bandwidth a large ring all-reduce reaches over the intra-node link, GB/s")
    nic_gbps: float = Field(gt=0, description="scale-out NIC bandwidth per GPU, Gbit/s")
    price_per_hour: float = Field(gt=0, description="USD per GPU-hour")


class ModelSpec(Strict, frozen=True):
    """What the performance model needs of an LLM."""

    name: str
    params_b: float = Field(gt=0, description="total parameters, billions")
    active_params_b: float = Field(gt=0, description="parameters active per token (MoE), billions")
    shared_params_b: float | None = Field(
        None, gt=0, description="MoE: parameters every token uses (attention, shared experts, dense "
        "layers, embeddings), billions; the rest are routed experts. None: a dense model")
    layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    prefill_attn_flops: float = Field(
        gt=0, description="attention FLOPs per query token per context token, all layers, as a "
        "prefill computes it (MLA: latent expanded to per-head K/V)")
    decode_attn_flops: float = Field(
        gt=0, description="the same as a decode computes it (MLA: weights absorbed, latent space)")
    kv_bytes_per_token: float = Field(gt=0, description="KV cache bytes per token, all layers")
    weight_dtype: str = Field(pattern="^(bf16|fp16|fp8|int8|int4)$", description="bytes read")
    compute_dtype: str = Field(pattern="^(bf16|fp16|fp8)$", description="dtype the matmuls run in")

    @model_validator(mode="after")
    def _shared_within_active(self):
        if self.active_params_b > self.params_b:
            raise ValueError("active_params_b exceeds params_b")
        if self.shared_params_b is not None and self.shared_params_b > self.active_params_b:
            raise ValueError("shared_params_b exceeds active_params_b")
        return self

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * DTYPE_BYTES[self.weight_dtype]

    @property
    def shared_weight_bytes(self) -> float:
        """Bytes every iteration reads whatever its batch (all of them for a dense model)."""
        shared = self.params_b if self.shared_params_b is None else self.shared_params_b
        return shared * 1e9 * DTYPE_BYTES[self.weight_dtype]

    @property
    def routed_pick_share(self) -> float:
        """Share of the routed experts' parameters one token uses (0 for a dense model)."""
        if self.shared_params_b is None or self.params_b == self.shared_params_b:
            return 0.0
        return (self.active_params_b - self.shared_params_b) / (self.params_b - self.shared_params_b)


def _known_gpu(name: str) -> str:
    if name not in gpus():
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(sorted(gpus()))}")
    return name


# one host figure for every GPU, or one per GPU (the launch cost is its server's host CPU's)
HostLaunchUs = NonNegativeFloat | dict[Annotated[str, AfterValidator(_known_gpu)], NonNegativeFloat]


class EngineProfile(Strict, frozen=True):
    """How close a serving engine gets to the hardware, per operation, and what it adds per
    iteration (data/engines.yaml says where each default comes from)."""

    name: str
    linear_bf16: float = Field(gt=0, le=1, description="share of the BF16 peak linear layers reach")
    linear_fp8: float = Field(gt=0, le=1, description="share of the FP8 peak linear layers reach")
    attn_prefill: float = Field(gt=0, le=1, description="share of the 16-bit peak of prefill attention")
    attn_decode: float = Field(gt=0, le=1, description="share of the 16-bit peak of decode attention")
    memory: float = Field(gt=0, le=1, description="share of the HBM bandwidth reading weights and KV")
    overhead_ms: float = Field(ge=0, description="per-iteration CPU/scheduling cost")
    allreduce_base_us: float = Field(ge=0, description="fixed latency of one all-reduce")
    allreduce_step_us: float = Field(ge=0, description="latency of one ring step (n GPUs: 2(n-1))")
    host_layer_us: HostLaunchUs = Field(
        0.0, description="host time to launch one layer's kernels, us (eager engines; 0 when "
        "graph-captured): one figure, or one per GPU")
    fitted_to: str = Field("", description="the measured source the constants are fitted to (a "
                           "prefix of its `source` column); empty: not fitted")

    def host_layer_s(self, gpu: str) -> float:
        """Host launch time per layer on `gpu`'s server; a per-GPU figure must name that GPU."""
        if not isinstance(self.host_layer_us, dict):
            return self.host_layer_us / 1e6
        if gpu not in self.host_layer_us:
            raise InputError(f"engine profile {self.name!r} has no host_layer_us for GPU {gpu!r} "
                             f"(it has {', '.join(sorted(self.host_layer_us))}); set "
                             "perf.host_layer_us")
        return self.host_layer_us[gpu] / 1e6


def _load(filename: str, spec: type[M]) -> dict[str, M]:
    raw = yaml.safe_load((resources.files("pddsim") / "data" / filename).read_text())
    return {name: spec(name=name, **fields) for name, fields in raw.items()}


@cache
def gpus() -> dict[str, GpuSpec]:
    return _load("gpus.yaml", GpuSpec)


@cache
def models() -> dict[str, ModelSpec]:
    return _load("models.yaml", ModelSpec)


@cache
def engines() -> dict[str, EngineProfile]:
    return _load("engines.yaml", EngineProfile)


def engine(name: str) -> EngineProfile:
    try:
        return engines()[name]
    except KeyError:
        raise InputError(f"unknown engine profile {name!r}; known: {', '.join(sorted(engines()))}") from None


def gpu(name: str) -> GpuSpec:
    try:
        return gpus()[name]
    except KeyError:
        raise InputError(f"unknown GPU {name!r}; known: {', '.join(sorted(gpus()))}") from None


def model(name: str) -> ModelSpec:
    try:
        return models()[name]
    except KeyError:
        raise InputError(f"unknown model {name!r}; known: {', '.join(sorted(models()))}") from None
