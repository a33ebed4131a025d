"""GPU and model catalogs: data files shipped with the package, validated on load."""
from __future__ import annotations

from functools import cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field

from pddsim.errors import InputError

DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuSpec(Strict):
    """The four dimensions that decide which phase a chip suits, plus its NIC and price."""

    name: str
    bf16_tflops: float = Field(gt=0, description="peak dense BF16 TFLOPS")
    fp8_tflops: float = Field(gt=0, description="peak dense FP8 TFLOPS (= BF16 where FP8 is unsupported)")
    hbm_gb: float = Field(gt=0, description="HBM capacity, GB (1e9 bytes)")
    hbm_tbps: float = Field(gt=0, description="HBM bandwidth, TB/s")
    interconnect_gbps: float = Field(gt=0, description="intra-node GPU-GPU bandwidth per GPU, GB/s")
    nic_gbps: float = Field(gt=0, description="scale-out NIC bandwidth per GPU, Gbit/s")
    price_per_hour: float = Field(gt=0, description="USD per GPU-hour")


class ModelSpec(Strict):
    """What the performance model needs of an LLM."""

    name: str
    params_b: float = Field(gt=0, description="total parameters, billions")
    active_params_b: float = Field(gt=0, description="parameters active per token (MoE), billions")
    layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    attn_flops_per_ctx_token: float = Field(
        gt=0, description="attention FLOPs per query token per context token, all layers")
    kv_bytes_per_token: float = Field(gt=0, description="KV cache bytes per token, all layers")
    weight_dtype: str = Field(pattern="^(bf16|fp16|fp8|int8|int4)$")

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * DTYPE_BYTES[self.weight_dtype]


def _load(filename: str, spec: type[Strict]) -> dict[str, Strict]:
    raw = yaml.safe_load(resources.files("pddsim").joinpath("data", filename).read_text())
    return {name: spec(name=name, **fields) for name, fields in raw.items()}


@cache
def gpus() -> dict[str, GpuSpec]:
    return _load("gpus.yaml", GpuSpec)


@cache
def models() -> dict[str, ModelSpec]:
    return _load("models.yaml", ModelSpec)


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
