"""GPU, model and engine catalogs: data files shipped with the package, validated on load, and
the entries a config or a catalog file of the user's brings beside them (`Catalog`)."""
from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Literal

import yaml
from pydantic import Field, NonNegativeFloat, field_validator, model_validator

from pddsim.errors import InputError
from pddsim.schema import M, Strict, read_yaml, validated

# bytes per value as stored: fp4 is NVFP4 (4-bit values, one FP8 scale per 16), mxfp4 the OCP
# microscaling format (4-bit values, one 8-bit power-of-two scale per 32); int4 counts the 4-bit
# values alone (group scales are small beside them)
DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5625,
               "mxfp4": 0.53125}
Dtype = Literal["bf16", "fp16", "fp8", "int8", "int4", "fp4", "mxfp4"]


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
    fp4_tflops: float | None = Field(
        None, gt=0, description="peak dense FP4 TFLOPS (null: no FP4 tensor cores; FP4 weights are "
        "dequantised and multiplied at the 16-bit rate)")
    nvlink_domain: int = Field(
        8, ge=1, description="GPUs joined by the NVLink fabric (8 in an HGX node, 72 in an NVL72 "
        "rack); a group of more GPUs crosses the scale-out NICs")

    def matmul_dtype(self, weights: str) -> str:
        """The dtype matmuls with `weights` run in: FP8 weights multiply in FP8 and FP4 in FP4
        where the chip has those units (either FP4 format); weight-only formats (INT4/INT8, FP4
        without FP4 units) dequantise and multiply at 16 bits."""
        if weights == "fp8" and self.fp8_tflops > self.bf16_tflops:
            return "fp8"
        if weights in ("fp4", "mxfp4") and self.fp4_tflops is not None:
            return "fp4"
        return "bf16"

    def peak_tflops(self, weights: str) -> float:
        """Dense tensor peak of matmuls with `weights`."""
        return {"fp8": self.fp8_tflops, "fp4": self.fp4_tflops or 0.0,
                "bf16": self.bf16_tflops}[self.matmul_dtype(weights)]

    def allreduce_s_per_byte(self, gpus: int) -> float:
        """Seconds per payload byte of one all-reduce over `gpus` GPUs. Inside the NVLink domain a
        ring at the measured bus bandwidth; past it hierarchical, as NCCL runs it with a NIC per
        GPU (one ring per NIC): reduce-scatter inside each domain, each GPU's 1/d share all-reduced
        across the domains over its own NIC, all-gather back."""
        d = min(gpus, self.nvlink_domain)
        domains = gpus / d
        inside = 2 * (d - 1) / d / (self.allreduce_bus_gbps * 1e9)
        return inside + 2 * (domains - 1) / domains / d / (self.nic_gbps / 8 * 1e9)

    def alltoall_s_per_byte(self, gpus: int) -> float:
        """Seconds per byte a GPU dispatches in an all-to-all spread evenly over `gpus` GPUs: the
        share bound for its own NVLink domain over NVLink, the rest over its NIC at the same time."""
        d = min(gpus, self.nvlink_domain)
        inside = (d - 1) / gpus / (self.interconnect_gbps * 1e9)
        return max(inside, (gpus - d) / gpus / (self.nic_gbps / 8 * 1e9))


class ModelSpec(Strict, frozen=True):
    """What the performance model needs of an LLM, as served: its dtypes are the checkpoint's
    unless a deployment's `quant` changes them (`served`)."""

    name: str
    params_b: float = Field(gt=0, description="total parameters, billions")
    active_params_b: float = Field(gt=0, description="parameters active per token (MoE), billions")
    shared_params_b: float | None = Field(
        None, gt=0, description="MoE: parameters every token uses (attention, shared experts, dense "
        "layers, embeddings), billions; the rest are routed experts. None: a dense model")
    layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    prefill_attn_flops: float = Field(
        gt=0, description="attention FLOPs per query token per context token, all full-attention "
        "layers, as a prefill computes it (MLA: latent expanded to per-head K/V)")
    decode_attn_flops: float = Field(
        gt=0, description="the same as a decode computes it (MLA: weights absorbed, latent space)")
    kv_bytes_per_token: float = Field(
        gt=0, description="KV cache bytes per token, all full-attention layers, in kv_dtype")
    kv_dtype: Dtype = Field("bf16", description="dtype of the KV cache as usually served")
    kv_heads: int | None = Field(
        None, ge=1, description="KV heads per layer: tensor parallelism beyond this many GPUs "
        "replicates the KV instead of splitting it (MLA: 1, its latent is one head); null: the "
        "KV splits across any TP")
    weight_dtype: Dtype = Field(description="dtype of the non-expert weights (sets the bytes read "
                                "and, for FP8/FP4, the matmul peak)")
    expert_dtype: Dtype | None = Field(None, description="MoE: dtype of the routed experts' "
                                       "weights (null: weight_dtype)")
    experts: int = Field(0, ge=0, description="MoE: routed experts per MoE layer (0: dense)")
    experts_per_token: int = Field(0, ge=0, description="MoE: routed experts each token uses")
    moe_layers: int = Field(0, ge=0, description="MoE: layers with routed experts")
    vocab_size: int = Field(0, ge=0, description="vocabulary: the LM head is computed only for "
                            "tokens that are sampled and the input embedding is a lookup (0: "
                            "every active parameter is computed for every token)")
    tied_embeddings: bool = Field(False, description="the LM head is the input embedding matrix")
    window_tokens: int = Field(0, ge=0, description="sliding-window layers: tokens they attend "
                               "to and keep KV for (0: none)")
    window_kv_bytes_per_token: float = Field(
        0.0, ge=0, description="KV bytes per token of the sliding-window layers (kept for at most "
        "window_tokens), in kv_dtype")
    window_attn_flops: float = Field(
        0.0, ge=0, description="attention FLOPs per query token per attended token, over the "
        "sliding-window layers")
    state_bytes: float = Field(
        0.0, ge=0, description="fixed per-request state of linear-attention layers, bytes (its "
        "size does not grow with the context)")
    sparse_attend_tokens: int = Field(
        0, ge=0, description="sparse attention (DeepSeek Sparse Attention): each query attends to "
        "at most this many context tokens an indexer selects, the KV of all kept (0: dense)")
    index_attn_flops: float = Field(
        0.0, ge=0, description="sparse attention: the indexer's FLOPs per query token per context "
        "token (it scores the whole context), all layers")
    index_kv_bytes_per_token: float = Field(
        0.0, ge=0, description="sparse attention: the indexer's keys, bytes per token, all layers: "
        "part of kv_bytes_per_token, read for every context token, kept in their own dtype")

    @model_validator(mode="after")
    def _consistent(self):
        if self.active_params_b > self.params_b:
            raise ValueError("active_params_b exceeds params_b")
        if self.shared_params_b is not None and self.shared_params_b > self.active_params_b:
            raise ValueError("shared_params_b exceeds active_params_b")
        moe = (self.experts, self.experts_per_token, self.moe_layers)
        if any(moe) and (not all(moe) or self.shared_params_b is None
                         or self.experts_per_token > self.experts):
            raise ValueError("a MoE needs shared_params_b, experts, experts_per_token (at most "
                             "experts) and moe_layers")
        if (self.window_tokens > 0) != (self.window_kv_bytes_per_token > 0):
            raise ValueError("window_tokens and window_kv_bytes_per_token go together")
        if self.index_kv_bytes_per_token >= self.kv_bytes_per_token:
            raise ValueError("index_kv_bytes_per_token is part of kv_bytes_per_token")
        return self

    def served(self, weights: str | None = None, experts: str | None = None,
               kv: str | None = None) -> ModelSpec:
        """This model with its weights, routed experts or KV cache stored in other dtypes (a
        deployment's quantisation); KV bytes scale with the KV dtype."""
        update: dict = {}
        if weights is not None:
            update["weight_dtype"] = weights
            if self.expert_dtype is None and experts is None:
                update["expert_dtype"] = self.weight_dtype
        if experts is not None:
            update["expert_dtype"] = experts
        if kv is not None:
            scale = DTYPE_BYTES[kv] / DTYPE_BYTES[self.kv_dtype]
            index = self.index_kv_bytes_per_token          # the indexer's keys keep their dtype
            update.update(kv_dtype=kv, kv_bytes_per_token=(self.kv_bytes_per_token - index) * scale + index,
                          window_kv_bytes_per_token=self.window_kv_bytes_per_token * scale)
        return self.model_copy(update=update) if update else self

    @property
    def routed_dtype(self) -> str:
        return self.expert_dtype or self.weight_dtype

    @property
    def routed_params(self) -> float:
        """Parameters of the routed experts, all layers (0 for a dense model)."""
        return 0.0 if self.shared_params_b is None else (self.params_b - self.shared_params_b) * 1e9

    @property
    def shared_params(self) -> float:
        """Parameters every iteration uses whatever its batch (all of a dense model's)."""
        return (self.params_b if self.shared_params_b is None else self.shared_params_b) * 1e9

    @property
    def weight_bytes(self) -> float:
        if self.routed_dtype == self.weight_dtype:
            return self.params_b * 1e9 * DTYPE_BYTES[self.weight_dtype]
        return self.shared_weight_bytes + self.routed_params * DTYPE_BYTES[self.routed_dtype]

    @property
    def weight_bytes_routed(self) -> float:
        return self.routed_params * DTYPE_BYTES[self.routed_dtype]

    @property
    def shared_weight_bytes(self) -> float:
        """Bytes every iteration reads whatever its batch (all of them for a dense model)."""
        return self.shared_params * DTYPE_BYTES[self.weight_dtype]

    @property
    def routed_pick_share(self) -> float:
        """Share of the routed experts' parameters one token uses (0 for a dense model)."""
        if not self.routed_params:
            return 0.0
        return (self.active_params_b * 1e9 - self.shared_params) / self.routed_params

    @property
    def head_params(self) -> float:
        """Parameters of the LM head, computed for sampled tokens only (0: not told apart)."""
        return float(self.vocab_size * self.hidden_size)

    @property
    def per_token_params(self) -> float:
        """Active parameters every computed token multiplies: all but the LM head and the input
        embedding (a lookup)."""
        embeddings = self.head_params * (1 if self.tied_embeddings else 2)
        return self.active_params_b * 1e9 - embeddings


# one host figure for every GPU, or one per GPU (the launch cost is its server's host CPU's); the
# GPU names are checked against the catalog they are used with (`Catalog.unknown_gpus`)
HostLaunchUs = NonNegativeFloat | dict[str, NonNegativeFloat]


class EngineProfile(Strict, frozen=True):
    """A serving engine: how close it gets to the hardware per operation, what it adds per
    iteration and per request, and how it schedules and admits work (data/engines.yaml says where
    each default comes from)."""

    name: str
    linear_bf16: float = Field(gt=0, le=1, description="share of the BF16 peak linear layers reach")
    linear_fp8: float = Field(gt=0, le=1, description="share of the FP8 peak linear layers reach")
    linear_fp4: float | None = Field(None, gt=0, le=1, description="share of the FP4 peak linear "
                                     "layers reach (null: linear_fp8)")
    attn_prefill: float = Field(gt=0, le=1, description="share of the 16-bit peak of prefill attention")
    attn_decode: float = Field(gt=0, le=1, description="share of the 16-bit peak of decode attention")
    memory: float = Field(gt=0, le=1, description="share of the HBM bandwidth reading weights and KV")
    expert_memory: float | None = Field(
        None, gt=0, le=1, description="MoE: share of the HBM bandwidth reached reading the routed "
        "experts' weights (their grouped GEMMs stream whole expert matrices; null: memory)")
    fp4_read: float = Field(
        1.0, gt=0, le=1, description="FP4 (NVFP4) weights are read at this fraction of the "
        "engine's share of the HBM bandwidth for other dtypes (its decode kernels unpack and scale "
        "every block as they stream it)")
    grouped_gemm: float = Field(
        1.0, gt=0, le=1, description="MoE: share of the linear layers' efficiency the routed "
        "experts' grouped GEMMs reach when every expert gets many tokens")
    expert_tokens_half: float = Field(
        0.0, ge=0, description="MoE: tokens per expert at which a grouped GEMM reaches half that "
        "efficiency (each expert an iteration touches costs as much as this many tokens more)")
    overhead_ms: float = Field(ge=0, description="per-iteration CPU/scheduling cost")
    seq_us: float = Field(0.0, ge=0, description="per-iteration CPU cost of each request in the "
                          "batch (scheduling, input preparation, sampling)")
    overlap: bool = Field(False, description="an overlap scheduler: the iteration's CPU work runs "
                          "while the GPU computes, so it bounds the iteration instead of adding")
    allreduce_base_us: float = Field(ge=0, description="fixed latency of one all-reduce")
    allreduce_step_us: float = Field(ge=0, description="latency of one ring step (n GPUs: 2(n-1))")
    alltoall_us: float = Field(0.0, ge=0, description="MoE: fixed latency of one expert-parallel "
                               "all-to-all (a dispatch or a combine)")
    alltoall_step_us: float = Field(0.0, ge=0, description="MoE: latency each further peer adds "
                                    "to one all-to-all (n GPUs: n-1 peers, each a message of its "
                                    "own: wide expert parallelism waits on more of them)")
    dp_balance_timeout_iters: int = Field(
        0, ge=0, description="attention data parallelism: new prompts wait until every rank has "
        "one, or until a counter running over the iterations without that reaches this many "
        "(TensorRT-LLM's attention_dp_config timeout_iters with enable_balance); 0: no waiting")
    dp_balance_wait_iters: int = Field(
        0, ge=0, description="with dp_balance_timeout_iters: iterations prompts on every rank are "
        "held further, while every rank decodes, to gather more (batching_wait_iters)")
    alltoall_scaleout_us: float = Field(
        0.0, ge=0, description="MoE: latency one all-to-all adds when its GPUs span more than one "
        "NVLink domain (its messages cross the scale-out NICs: RDMA round trips, proxies, "
        "completion polling)")
    host_layer_us: HostLaunchUs = Field(
        0.0, description="host time to launch one layer's kernels, us, in iterations launched "
        "eagerly: their GPU work cannot take less than layers x this. One figure, or one per GPU")
    moe_layer_us: float = Field(
        0.0, ge=0, description="MoE: GPU time of each MoE layer that does not shrink with the "
        "batch, in every iteration, us (the router's top-k, token permutation and un-permutation, "
        "the grouped GEMMs' tile scheduling: a chain of small dependent kernels, captured or not)")
    index_layer_us: float = Field(
        0.0, ge=0, description="sparse attention (an indexer choosing the tokens each query "
        "attends to): GPU time of each layer's indexer chain that does not shrink with the batch, "
        "in every iteration, us (its query and key projections, the key cache write, the "
        "logits, the top-k and the sparse attention's gather: a chain of small dependent "
        "kernels, captured or not)")
    eager_moe_layer_us: float = Field(
        0.0, ge=0, description="MoE: fixed time of each MoE layer in an iteration launched eagerly "
        "(routing, token permutation, grouped-GEMM setup and their launches), us; captured decode "
        "graphs do not pay it")
    eager_expert_us: float = Field(
        0.0, ge=0, description="MoE: fixed time per routed expert an eagerly launched iteration "
        "touches, in each MoE layer, us (per-expert bookkeeping on every rank: token counts and "
        "offsets, the grouped GEMM's problem list and its launches); captured decode graphs do "
        "not pay it")
    fused_moe: tuple[Dtype, ...] = Field(
        (), description="MoE: expert dtypes whose layers the engine runs as one fused kernel that "
        "routes inside it: their eager iterations pay no eager_expert_us")
    graph_max_batch: int = Field(
        0, ge=0, description="decode-only iterations of at most this many requests replay a "
        "captured CUDA graph (no launch floor); 0: every iteration is launched eagerly")
    stream_us: float = Field(
        0.0, ge=0, description="front-end time to detokenise and stream one token: an iteration "
        "serving n streams cannot end faster than n of these")
    frontend_ms: float = Field(
        0.0, ge=0, description="time a request spends outside the engine before its first token "
        "reaches the user (HTTP, tokenisation, routing, streaming the first token back)")
    frontend_serial_ms: float = Field(
        0.0, ge=0, description="time of a request's work in the engine's one serving process "
        "(HTTP parsing, tokenisation, scheduling it in), one request after another: requests "
        "sent together reach the engine this far apart")
    frontend_stream_us: float = Field(
        0.0, ge=0, description="time a request's intake takes for each other request the "
        "server is serving (each live stream is visited as a request is taken in): a cost per "
        "request that grows with the streams, paid by that request alone")
    frontend_jitter_ms: float = Field(
        0.0, ge=0, description="mean of a random extra front-end time per request (exponential, "
        "seeded): requests sent together reach the engine apart, as real front ends' "
        "per-request work varies")
    scheduler: Literal["mixed", "prefill_first"] = Field(
        "mixed", description="mixed: prefill chunks join the decoders' iterations (decode first, "
        "chunks fill the rest of the token budget); prefill_first: waiting prompts run in "
        "iterations of their own while the decoders pause")
    admission: Literal["optimistic", "reserve"] = Field(
        "optimistic", description="optimistic: admit while the prompt fits, preempt (recompute) "
        "the newest decoder when memory runs out; reserve: admit only when the prompt and "
        "reserve_share of the output fit beside what admitted requests have reserved")
    reserve_share: float = Field(
        1.0, ge=0, le=1, description="reserve admission: share of a request's output reserved "
        "at admission (1: its whole length, never preempting; less: decoders outgrowing their "
        "reservations preempt the newest, after which the engine reserves whole lengths)")
    memory_rule: Literal["total", "free"] = Field(
        "total", description="how batching.memory_utilization applies: a share of the HBM "
        "(weights and activations inside it), or of what weights and activations leave free")
    activation_gb: float = Field(0.0, ge=0, description="HBM per GPU kept for activations, "
                                 "workspaces and captured graphs, GB")
    # the engine's defaults for a config's `batching` (which overrides them there)
    token_budget: int = Field(8192, ge=1, description="tokens one iteration may compute")
    prefill_chunk: int = Field(8192, ge=1, description="largest prefill chunk of one request")
    max_batch: int = Field(256, ge=1, description="requests in one iteration at most")
    chunk_packing: Literal["packed", "alone", "whole"] = Field(
        "packed", description="how prefill chunks share an iteration (config.Batching)")
    rank_budget: bool = Field(
        True, description="attention data parallelism: each rank schedules its own iteration "
        "share, so the token budget is each rank's (vLLM's engine cores, TensorRT-LLM's per-rank "
        "schedulers); false: the worker's, split among its ranks (SGLang divides its chunked-"
        "prefill size by the DP size)")
    memory_utilization: float = Field(0.9, gt=0, le=1, description="share of HBM the engine may "
                                      "use (see memory_rule)")
    fitted_to: str = Field("", description="the measured source the constants are fitted to (a "
                           "prefix of its `source` column); empty: not fitted")

    def linear_share(self, matmul_dtype: str) -> float:
        """Share of the peak linear layers reach in `matmul_dtype` (GpuSpec.matmul_dtype)."""
        if matmul_dtype == "fp4":
            return self.linear_fp4 if self.linear_fp4 is not None else self.linear_fp8
        return self.linear_fp8 if matmul_dtype == "fp8" else self.linear_bf16

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


KINDS = {"gpus": "GPU", "models": "model", "engines": "engine profile"}
_BUNDLED: dict[str, Callable[[], dict[str, Any]]] = {"gpus": gpus, "models": models, "engines": engines}


# what `pddsim catalog list` shows of an entry
_BRIEF = {"gpus": "{hbm_gb:g} GB at {hbm_tbps:g} TB/s, {bf16_tflops:g} BF16 TFLOPS, ${price_per_hour:g}/h",
          "models": "{params_b:g}B parameters ({active_params_b:g}B active), {weight_dtype}",
          "engines": "{overhead_ms:g} ms an iteration, {scheduler} scheduler, {admission} admission"}


class _Entry(Strict, frozen=True):
    """What a user's entry has beyond the bundled file's fields."""

    override: bool = Field(False, description="shadow the bundled entry of this name (without "
                           "it, a name the package already has is an error)")
    source: str = Field("", description="the file the entry came from (set by the loader)")


class GpuEntry(GpuSpec, _Entry, frozen=True):
    """A GPU of the user's, in gpus.yaml's format."""


class ModelEntry(ModelSpec, _Entry, frozen=True):
    """A model of the user's, in models.yaml's format."""


class EngineEntry(EngineProfile, _Entry, frozen=True):
    """An engine profile of the user's, in engines.yaml's format."""


class Catalog(Strict, frozen=True):
    """Entries a config (`catalog:`) or a catalog file (`--catalog FILE`) brings beside the
    bundled ones, each section in the format of the bundled file of its kind (`pddsim/data/`):
    a planner's own GPU, model or engine without editing the installed package. A name the
    package has is an error unless the entry says `override: true`."""

    gpus: dict[str, GpuEntry] = Field(default_factory=dict, description="as pddsim/data/gpus.yaml")
    models: dict[str, ModelEntry] = Field(default_factory=dict, description="as pddsim/data/models.yaml")
    engines: dict[str, EngineEntry] = Field(default_factory=dict,
                                            description="as pddsim/data/engines.yaml")
    include: list[str] = Field(
        default_factory=list, description="catalog files (relative to the config; `--catalog "
        "FILE` adds one), each a mapping of these sections: `load_config` reads them into the "
        "sections here, each entry with its file as its source")

    @field_validator("gpus", "models", "engines", mode="before")
    @classmethod
    def _named_by_key(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        return {key: {"name": key, **fields} if isinstance(fields, dict) else fields
                for key, fields in raw.items()}

    @model_validator(mode="after")
    def _against_bundled(self):
        if self.include:
            raise ValueError(f"include: {self.include[0]!r} is not read: a config's "
                             "catalog.include is read by load_config, not by a catalog file or "
                             "a tree validated directly")
        for kind, entries in self.sections().items():
            what, bundled = KINDS[kind], _BUNDLED[kind]()
            for key, entry in entries.items():
                if entry.name != key:
                    raise ValueError(f"{kind}.{key}.name: an entry is named by its key "
                                     f"({entry.name!r} given)")
                if key in bundled and not entry.override:
                    raise ValueError(f"{kind}.{key}: the package has a {what} of this name; "
                                     "set `override: true` to shadow it, or rename yours")
                if entry.override and key not in bundled:
                    raise ValueError(f"{kind}.{key}.override: the package has no {what} "
                                     f"{key!r} to shadow")
        for key, entry in self.engines.items():
            unknown = self.unknown_gpus(entry.host_layer_us)
            if unknown:
                raise ValueError(f"engines.{key}.host_layer_us: {unknown}")
        return self

    def sections(self) -> dict[str, dict[str, _Entry]]:
        return {kind: getattr(self, kind) for kind in KINDS}

    def known(self, kind: str) -> dict[str, Any]:
        """Every entry of `kind` ("gpus", "models", "engines"): the bundled ones, shadowed and
        joined by this catalog's."""
        return {**_BUNDLED[kind](), **self.sections()[kind]}

    def source(self, kind: str, name: str) -> str:
        """Where an entry of `kind` comes from: a file of the user's, or the package's data."""
        entry = getattr(self, kind).get(name)
        return (entry.source or "config") if entry is not None else f"pddsim/data/{kind}.yaml"

    def find(self, kind: str, name: str) -> Any:
        known = self.known(kind)
        if name not in known:
            raise InputError(f"unknown {KINDS[kind]} {name!r}; known: {', '.join(sorted(known))}")
        return known[name]

    def gpu(self, name: str) -> GpuSpec:
        return self.find("gpus", name)

    def model(self, name: str) -> ModelSpec:
        return self.find("models", name)

    def engine(self, name: str) -> EngineProfile:
        return self.find("engines", name)

    def listing(self, kind: str | None = None) -> str:
        """Every entry of `kind` (default: all kinds), one line each: its main figures and where
        it comes from."""
        if kind not in (None, *KINDS):
            raise InputError(f"catalog list {kind}: say {', '.join(KINDS)} or nothing (all)")
        lines = []
        for k in [kind] if kind else KINDS:
            lines.append(f"{k}:")
            lines += [f"  {name:<20} {_BRIEF[k].format(**dict(entry)):<58} {self.source(k, name)}"
                      for name, entry in sorted(self.known(k).items())]
        return "\n".join(lines) + "\n"

    def entry_yaml(self, name: str) -> str:
        """The entries called `name`, each under a line saying where it comes from, in the
        catalog files' format (what this prints is a valid entry of one)."""
        texts = []
        for kind in KINDS:
            entry = self.known(kind).get(name)
            if entry is not None:
                fields = entry.model_dump(mode="json", exclude={"name", "source"})
                if not fields.get("override", True):
                    del fields["override"]
                texts.append(f"# {KINDS[kind]} {name}, from {self.source(kind, name)}\n"
                             + yaml.safe_dump({name: fields}, sort_keys=False))
        if not texts:
            raise InputError(f"no GPU, model or engine profile {name!r} (`pddsim catalog list`)")
        return "".join(texts)

    def unknown_gpus(self, host_layer_us: HostLaunchUs | None) -> str:
        """'' if every GPU a per-GPU host figure names is known, else what is wrong."""
        if not isinstance(host_layer_us, dict):
            return ""
        unknown = sorted(set(host_layer_us) - set(self.known("gpus")))
        return (f"unknown GPU {unknown[0]!r}; known: {', '.join(sorted(self.known('gpus')))}"
                if unknown else "")


BUNDLED = Catalog()


def raw_entries(raw: dict) -> list[tuple[str, str, dict]]:
    """(kind, name, fields) of each entry of a raw catalog tree, as far as it is well-formed (the
    rest is left to validation)."""
    return [(kind, name, fields) for kind in KINDS if isinstance(raw.get(kind), dict)
            for name, fields in raw[kind].items() if isinstance(fields, dict)]


def with_files(raw: dict, base_dir: Path) -> dict:
    """A raw `catalog:` tree with the files it includes read into its sections: each file
    validated on its own (errors name it), each entry marked with its file; a name defined twice
    is an error naming both places."""
    merged = {k: v for k, v in raw.items() if k != "include"}
    for given in raw.get("include") or ():
        path = base_dir / str(given)
        tree = read_yaml(path, "catalog")
        if not isinstance(tree, dict):
            raise InputError(f"{path}: a catalog is a YAML mapping of {', '.join(KINDS)}")
        validated(Catalog, tree, str(path))
        for kind, name, fields in raw_entries(tree):
            section = merged.setdefault(kind, {})
            if name in section:
                raise InputError(f"{path}: {kind}.{name}: also defined in "
                                 f"{section[name].get('source', 'the config')}")
            section[name] = {**fields, "source": str(path.resolve())}
    return merged


def engine(name: str) -> EngineProfile:
    return BUNDLED.engine(name)


def gpu(name: str) -> GpuSpec:
    return BUNDLED.gpu(name)


def model(name: str) -> ModelSpec:
    return BUNDLED.model(name)
