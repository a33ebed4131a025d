"""How long one batch iteration takes on an instance.

The roofline model (default) prices an iteration as the larger of its compute time and its HBM time,
plus the collectives (tensor-parallel all-reduces, expert-parallel all-to-alls) and the engine's
CPU work per iteration and per request; an iteration launched eagerly cannot go faster than its
host launches the kernels (a floor per layer), nor any iteration faster than the front end streams
its tokens. Weights are read once per iteration, so a small prefill chunk pays the same weight read
as a large one: that is what makes unbatched tail chunks expensive. Every running request's KV is
read too, so decode slows as contexts grow. A MoE's routed experts are grouped GEMMs: each expert an
iteration touches is read once and pays a fixed cost, so few tokens per expert run far below the
dense peak, and under expert parallelism the busiest group of experts sets the pace (tokens pick
experts at random); an iteration launched eagerly also pays a fixed time per MoE layer and per
routed expert it touches (the routing's bookkeeping and launches every rank does). An instance
may split its GPUs into attention data-parallel ranks (each holding its requests' KV and a replica
of the non-expert weights) with the experts spread over all of them.
The table model replaces the roofline by measured iteration times interpolated from a CSV.
"""
from __future__ import annotations

import csv
from bisect import bisect_left
from functools import cache
from math import ceil, floor
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from pddsim.catalog import BUNDLED, DTYPE_BYTES, Catalog, EngineProfile, GpuSpec, ModelSpec
from pddsim.errors import InputError

if TYPE_CHECKING:
    from pddsim.config import Perf

ACT_BYTES = 2.0  # activations travel in BF16 in the tensor-parallel all-reduces and all-to-alls


@cache
def expected_max_normal(n: int) -> float:
    """Expected maximum of n independent standard normal draws: the integral of x n phi(x)
    Phi(x)^(n-1), by the trapezoid rule on a fine grid (0.564 for 2, 1.029 for 4, 1.424 for 8;
    sqrt(2 ln n), its limit, overstates it at every size an engine runs)."""
    x, dx = np.linspace(-12.0, 12.0, 24001, retstep=True)
    pdf = np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi)
    cdf = np.concatenate(([0.0], np.cumsum(pdf[1:] + pdf[:-1]) * dx / 2))
    f = x * n * pdf * cdf ** (n - 1)
    return float((f.sum() - (f[0] + f[-1]) / 2) * dx)


def chunk_attention_pairs(context, chunk):
    """Query-key pairs of a prefill chunk of `chunk` tokens over `context` resident ones: each of
    its tokens attends to the context, and causally to the chunk (half of it, on average). The
    engine, the sessions' estimate and the handoff benchmark all price a chunk by it (scalars or
    arrays)."""
    return chunk * (context + chunk / 2)


class DecodeRun(Protocol):
    """k decode iterations of a fixed batch, priced at once: how long the first m take, the longest
    of them, and how many end by time t; `k` iterations in all, `total_s` long, the first
    `first_s`."""

    k: int
    total_s: float
    first_s: float

    def elapsed(self, m: int) -> float: ...
    def longest(self, m: int) -> float: ...
    def cut(self, t: float) -> int: ...


class PerfModel(Protocol):
    """The seam an instance prices its iterations through (`perf.kind` in the config).

    An iteration computes `tokens`, attends `attn_pairs` query x context token pairs
    (`decode_pairs` of them by decode tokens), reads `kv_tokens_read` tokens of KV, and serves
    `requests` requests (each costs the scheduler its share); null: one per token when every
    token is a decode, else one. `samples`: tokens that go through the LM head, each a query
    attending at most a sparse cap (null: one per request; a verify step of multi-token decoding
    samples each of its query tokens). `largest`: the tokens of its largest request (null: an
    even share, tokens / requests), which attention data parallelism cannot split."""

    def iteration(self, tokens: int, attn_pairs: float, kv_tokens_read: float,
                  decode_pairs: float = 0.0, requests: float | None = None,
                  samples: float | None = None, largest: float | None = None) -> float: ...
    def iterations(self, tokens: np.ndarray, attn_pairs: np.ndarray, kv_tokens_read: np.ndarray,
                   decode_pairs: np.ndarray | float = 0.0,
                   requests: np.ndarray | float | None = None,
                   samples: np.ndarray | float | None = None,
                   largest: np.ndarray | float | None = None) -> np.ndarray: ...
    def decode_run(self, n: int, context: int, k: int) -> DecodeRun: ...


class Roofline:
    """Roofline iteration time for `model` on `tp` x `dp` GPUs of type `gpu` served by `engine`:
    `dp` attention data-parallel ranks of `tp` tensor-parallel GPUs each, the routed experts spread
    `ep` ways (and tensor-parallel over the rest). Per GPU, the busiest attention rank setting
    the pace: each request lives on one rank, so an iteration whose largest request is more than
    an even share of its tokens waits for that request's rank (`_busiest`)."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int, engine: EngineProfile,
                 dp: int = 1, ep: int = 1):
        gpus = tp * dp
        attn_peak = gpus * gpu.bf16_tflops * 1e12                 # attention kernels run in 16-bit
        dense_flops = gpus * gpu.peak_tflops(model.weight_dtype) * 1e12 \
            * engine.linear_share(gpu.matmul_dtype(model.weight_dtype))
        routed_active = model.active_params_b * 1e9 - model.shared_params
        self.s_per_token = 2.0 * (model.per_token_params - routed_active) / dense_flops
        self.s_per_sample = 2.0 * model.head_params / dense_flops
        self.s_per_prefill_pair = model.prefill_attn_flops / (attn_peak * engine.attn_prefill)
        self.s_per_decode_pair = model.decode_attn_flops / (attn_peak * engine.attn_decode)
        self.s_per_token += model.window_tokens * model.window_attn_flops / (attn_peak * engine.attn_decode)
        # routed experts: grouped GEMMs at a share of the dense efficiency, each touched expert
        # paying `expert_tokens_half` tokens' worth more (`_routed_compute`)
        expert_flops = gpus * gpu.peak_tflops(model.routed_dtype) * 1e12 * engine.grouped_gemm \
            * engine.linear_share(gpu.matmul_dtype(model.routed_dtype))
        self.s_per_routed_token = 2.0 * routed_active / expert_flops
        self.s_per_touched = 2.0 * engine.expert_tokens_half * model.routed_params / expert_flops
        # expert parallelism runs in lockstep at the pace of its busiest group: with tokens routed
        # at random, a group's share of the k x tokens picks has a relative standard deviation of
        # sqrt((ep - 1) / (k x tokens)), and the busiest of ep groups is the expected maximum of
        # ep standard normals of them above its share
        self.dp = dp
        self.ep, self.imbalance_scale = ep, (
            expected_max_normal(ep) ** 2 * (ep - 1) / model.experts_per_token
            if ep > 1 and model.experts else 0.0)
        bytes_per_s = gpu.hbm_tbps * 1e12 * engine.memory
        kv_split = dp * min(tp, model.kv_heads or tp)            # GPUs one token's KV spreads over
        # sparse attention: each query attends to at most `cap` tokens (and reads their KV), the
        # indexer scores every context token and reads every token's keys
        self.cap = model.sparse_attend_tokens
        index = model.index_kv_bytes_per_token
        self.s_per_kv_token = (model.kv_bytes_per_token - index) / kv_split / bytes_per_s
        self.s_per_index_kv = index / kv_split / bytes_per_s
        self.s_per_index_pair = model.index_attn_flops / (attn_peak * engine.attn_prefill)
        self.s_per_request = (model.window_tokens * model.window_kv_bytes_per_token / kv_split
                              + 2 * model.state_bytes / gpus) / bytes_per_s
        lookup = 0.0 if model.tied_embeddings else model.head_params * DTYPE_BYTES[model.weight_dtype]
        weights_per_s = bytes_per_s * (engine.fp4_read if model.weight_dtype == "fp4" else 1.0)
        self.shared_s = (model.shared_weight_bytes - lookup) / tp / weights_per_s
        expert_bytes_per_s = gpu.hbm_tbps * 1e12 * (engine.expert_memory or engine.memory)
        if model.routed_dtype == "fp4":
            expert_bytes_per_s *= engine.fp4_read
        self.routed_s = model.routed_params * DTYPE_BYTES[model.routed_dtype] / gpus / expert_bytes_per_s
        self.pick_share = model.routed_pick_share
        # two all-reduces per layer within a rank (GpuSpec.allreduce_s_per_byte: a ring inside the
        # NVLink domain, hierarchical past it), in 2(n-1) latency-bound steps
        allreduces = 2 * model.layers
        self.comm_s_per_token = (allreduces * model.hidden_size * ACT_BYTES
                                 * gpu.allreduce_s_per_byte(tp) / dp)
        latency_s = (engine.allreduce_base_us + engine.allreduce_step_us * 2 * (tp - 1)) / 1e6
        comm_fixed = 0.0 if tp == 1 else allreduces * latency_s
        if ep > 1 and model.moe_layers:     # a dispatch and a combine per MoE layer
            self.comm_s_per_token += (2 * model.moe_layers * model.experts_per_token * model.hidden_size
                                      * ACT_BYTES * gpu.alltoall_s_per_byte(ep) / gpus)
            scaleout = engine.alltoall_scaleout_us if gpus > gpu.nvlink_domain else 0.0
            comm_fixed += 2 * model.moe_layers * (engine.alltoall_us + scaleout
                                                  + engine.alltoall_step_us * (ep - 1)) / 1e6
        # the engine's CPU work per iteration: added to the GPU's, or (overlapped) bounding it
        self.cpu_s, self.cpu_per_request = engine.overhead_ms / 1e3, engine.seq_us / 1e6
        self.overlap = engine.overlap
        # each MoE layer's chain of small routing kernels (top-k, permutation, un-permutation)
        # takes a time of its own whatever the batch, unless one fused kernel routes inside it
        fused = model.routed_dtype in engine.fused_moe
        moe_fixed = 0.0 if fused else engine.moe_layer_us / 1e6 * model.moe_layers
        # likewise each sparse-attention layer's indexer chain
        index_fixed = engine.index_layer_us / 1e6 * model.layers if model.index_attn_flops else 0.0
        self.fixed_s = comm_fixed + moe_fixed + index_fixed + (0.0 if self.overlap else self.cpu_s)
        # An eager engine's host launches every kernel of a layer one by one while the GPU runs
        # them asynchronously: the slower of the two paces each layer, and the layers are alike,
        # so the GPU work (collectives included) cannot take less than layers x the host's launch
        # time. Each worker launches the same kernels on its own CPU core: the floor does not
        # shrink with more GPUs. A decode iteration of at most `graph_max_batch` requests replays
        # a captured graph instead (no floor).
        self.host_s = engine.host_layer_s(gpu.name) * model.layers
        self.eager_moe_s = engine.eager_moe_layer_us / 1e6 * model.moe_layers
        # and each routed expert it touches pays the engine's per-expert bookkeeping, on every
        # rank whatever its share of the experts (each rank routes over all of them), unless the
        # engine runs experts of that dtype in a fused kernel that routes inside it
        per_expert_us = 0.0 if fused else engine.eager_expert_us
        self.eager_experts_s = per_expert_us / 1e6 * model.experts * model.moe_layers
        self.graph_max_batch = engine.graph_max_batch
        self.stream_s = engine.stream_us / 1e6
        # hot-path shortcuts, exact: a dense model's expert terms are 0, and so is the floor of an
        # engine with no launch floor, no overlapped CPU work and no streaming cost
        self.moe = self.routed_s > 0
        self.floored = bool(self.host_s or self.stream_s
                            or (self.overlap and (self.cpu_s or self.cpu_per_request)))

    @classmethod
    def from_config(cls, model: ModelSpec, gpu: GpuSpec, tp: int, perf: Perf,
                    base_dir: Path = Path("."), dp: int = 1, ep: int = 1,
                    known: Catalog = BUNDLED) -> Roofline:
        """The roofline under a config's `perf`: its engine (of the config's catalog, `known`)
        with its overrides."""
        return cls(model, gpu, tp, perf.engine_profile(known), dp, ep)

    def touched_share(self, tokens):
        """Share of the routed experts an iteration of `tokens` touches (each token picks its
        share independently)."""
        return 1.0 - (1.0 - self.pick_share) ** tokens

    def weights_read_s(self, tokens):
        """Time to read the weights one iteration needs: the non-expert part always; a MoE
        touches more routed experts as the batch grows."""
        return self.shared_s + self.routed_s * self.touched_share(tokens)

    def imbalance(self, tokens, mn=min):
        """How much more than its share the busiest expert-parallel group computes: the expected
        maximum of the groups' routed tokens over their mean (a normal approximation, at most all
        of them on one group). `mn`: the minimum of two scalars (builtin) or arrays (numpy's)."""
        if not self.imbalance_scale:
            return 1.0
        return mn(1.0 + (self.imbalance_scale / (tokens + (tokens < 1))) ** 0.5, self.ep)

    def _routed_compute(self, tokens, mn=min):
        return self.imbalance(tokens, mn) * (tokens * self.s_per_routed_token
                                             + self.s_per_touched * self.touched_share(tokens))

    def _eager_moe(self, tokens):
        """What an iteration's MoE layers cost when launched eagerly: a fixed time per layer and
        one per routed expert the iteration touches."""
        return self.eager_moe_s + self.eager_experts_s * self.touched_share(tokens)

    def _scheduled(self, requests, mx, mn):
        """Requests the busiest attention rank's scheduler handles: each data-parallel rank runs
        its own scheduler process (an executor, engine core or scheduler per rank), so the
        per-request CPU work of an iteration is paid in parallel, an even share on each (at
        least one request while any is running)."""
        return requests if self.dp == 1 else mx(requests / self.dp, mn(requests, 1))

    def _floor(self, requests, eager, mx, mn=min):
        cpu = self.cpu_s + self._scheduled(requests, mx, mn) * self.cpu_per_request
        host = self.host_s * eager
        floor = mx(host, cpu) if self.overlap else (host + cpu) * (host > 0)
        return mx(floor, requests * self.stream_s)

    def floor_s(self, requests: float, eager: bool = True) -> float:
        """The least an iteration of `requests` takes whatever its GPU work: the host's launches
        (eager iterations; the CPU work adds to them unless overlapped), the overlapped CPU
        work, the front end's streaming."""
        return self._floor(requests, eager, max)

    def _busiest(self, tokens, requests, largest, mx):
        """How many times its even share of the iteration's dense layers and prefill attention
        the busiest attention data-parallel rank does: requests are not split over ranks, so it
        holds at least the largest request, and with fewer requests than ranks some ranks idle.
        The routed experts are spread over the expert-parallel GPUs whatever the ranks hold, and
        so, at its even share, is the collectives' time: scaled to the busiest rank, the
        all-to-all (each token's k expert copies at 16 bits over its rank's links) put wide-EP
        first tokens at 2-4x what was measured, more than the dispatch kernels send (FP8, one
        copy per node)."""
        largest = tokens / mx(requests, 1) if largest is None else largest
        return mx(1.0, self.dp * largest / mx(tokens, 1))

    def _time(self, tokens, attn_pairs, kv, decode_pairs, requests, samples, largest, mx, mn):
        """One formula for a single iteration (builtin `mx`, `mn`: the hot path stays scalar) and
        for arrays of them (numpy's). A decode iteration replays a captured graph up to
        `graph_max_batch` requests on each attention rank (each captures its own), whatever
        query tokens each verifies."""
        per_rank = self._scheduled(requests, mx, mn)
        eager = 1 - (decode_pairs >= attn_pairs) * (per_rank <= self.graph_max_batch)
        decode_raw = decode_pairs
        prefill_pairs, attended = attn_pairs - decode_pairs, kv
        if self.cap:      # each query attends to at most `cap` tokens (every token a query at most)
            prefill_pairs = mn(prefill_pairs, tokens * self.cap)
            decode_pairs = mn(decode_pairs, samples * self.cap)
            attended = mn(kv, requests * self.cap)
        if self.dp > 1:
            # the rank holding the largest request (a prefill chunk) paces the dense layers and
            # the prefill's attention; the decoders are spread over the ranks whatever rank holds
            # the chunk, so their attention, KV reads and sampling weigh at an even share (or
            # one request's, with fewer requests than ranks)
            f = self._busiest(tokens, requests, largest, mx)
            g = mx(1.0, self.dp / mx(requests, 1))
            decode_kv, decode_index_kv = mn(attended, decode_pairs), mn(kv, decode_raw)
            compute = (tokens * self.s_per_token * f + samples * self.s_per_sample * g
                       + (self._routed_compute(tokens, mn) if self.moe else 0.0)
                       + prefill_pairs * self.s_per_prefill_pair * f
                       + decode_pairs * self.s_per_decode_pair * g
                       + ((attn_pairs - decode_raw) * f + decode_raw * g) * self.s_per_index_pair)
            memory = ((self.weights_read_s(tokens) if self.moe else self.shared_s)
                      + (decode_kv * g + (attended - decode_kv) * f) * self.s_per_kv_token
                      + (decode_index_kv * g + (kv - decode_index_kv) * f) * self.s_per_index_kv
                      + requests * self.s_per_request * g)
        else:       # one rank: the same sums in their plain order (bit-identical results)
            compute = (tokens * self.s_per_token + samples * self.s_per_sample
                       + (self._routed_compute(tokens, mn) if self.moe else 0.0)
                       + prefill_pairs * self.s_per_prefill_pair
                       + decode_pairs * self.s_per_decode_pair + attn_pairs * self.s_per_index_pair)
            memory = ((self.weights_read_s(tokens) if self.moe else self.shared_s)
                      + attended * self.s_per_kv_token + kv * self.s_per_index_kv
                      + requests * self.s_per_request)
        cpu = 0.0 if self.overlap else per_rank * self.cpu_per_request
        t = (mx(compute, memory) + tokens * self.comm_s_per_token + self.fixed_s + cpu
             + (self._eager_moe(tokens) if self.eager_experts_s else self.eager_moe_s) * eager)
        return mx(t, self._floor(requests, eager, mx, mn)) if self.floored else t

    def iteration(self, tokens: int, attn_pairs: float, kv_tokens_read: float,
                  decode_pairs: float = 0.0, requests: float | None = None,
                  samples: float | None = None, largest: float | None = None) -> float:
        """Time of one iteration (see PerfModel)."""
        if requests is None:
            requests = tokens if decode_pairs >= attn_pairs > 0 else 1
        return float(self._time(tokens, attn_pairs, kv_tokens_read, decode_pairs, requests,
                                requests if samples is None else samples, largest, max, min))

    def iterations(self, tokens, attn_pairs, kv_tokens_read, decode_pairs=0.0,
                   requests=None, samples=None, largest=None) -> np.ndarray:
        """Many independent iterations at once."""
        tokens = np.asarray(tokens, dtype=float)
        attn_pairs, decode_pairs = np.asarray(attn_pairs, dtype=float), np.asarray(decode_pairs, dtype=float)
        if requests is None:
            requests = np.where((decode_pairs >= attn_pairs) & (attn_pairs > 0), tokens, 1.0)
        requests = np.asarray(requests, dtype=float)
        return self._time(tokens, attn_pairs, np.asarray(kv_tokens_read, dtype=float), decode_pairs,
                          requests, requests if samples is None else np.asarray(samples, dtype=float),
                          None if largest is None else np.asarray(largest, dtype=float),
                          np.maximum, np.minimum)

    def decode_run(self, n: int, context: int, k: int) -> LinearRun | FlooredRun:
        """k decode iterations of n requests holding `context` KV tokens at the first, growing by
        n tokens an iteration: both roofline terms are linear in the iteration index, and the
        floor, when it binds, binds the first iterations (the terms only grow). Sparse attention
        stops growing once the contexts reach its cap: a run ends there (fewer than k
        iterations) and the next one starts capped, so each stays linear."""
        attended, growth = context, n
        if self.cap:
            if context >= n * self.cap:
                attended, growth = n * self.cap, 0
            else:
                k = min(k, (n * self.cap - context) // n + 1)
        f = max(1.0, self.dp / n)       # fewer requests than attention ranks: one on each
        # the helpers serve arrays too (untyped): their scalars are declared so that the sums
        # stay native when compiled
        routed: float = self._routed_compute(n) if self.moe else 0.0
        compute = (n * (self.s_per_token + self.s_per_sample) * f + routed
                   + attended * self.s_per_decode_pair * f + context * self.s_per_index_pair * f,
                   growth * self.s_per_decode_pair * f + n * self.s_per_index_pair * f)
        weights: float = self.weights_read_s(n) if self.moe else self.shared_s
        memory = (weights + attended * self.s_per_kv_token * f + context * self.s_per_index_kv * f
                  + n * self.s_per_request * f,
                  growth * self.s_per_kv_token * f + n * self.s_per_index_kv * f)
        per_rank: float = self._scheduled(n, max, min)
        cpu = 0.0 if self.overlap else per_rank * self.cpu_per_request
        eager = per_rank > self.graph_max_batch
        eager_moe = self._eager_moe(n) if eager and self.eager_experts_s else self.eager_moe_s
        run = LinearRun(compute, memory, n * self.comm_s_per_token + self.fixed_s + cpu
                        + eager_moe * eager, k)
        if not self.floored:
            return run
        floor = self._floor(n, eager, max)
        return FlooredRun(run, floor) if run.first_s < floor else run


class MeasuredTable:
    """Iteration times measured on real hardware, interpolated bilinearly, prefill and decode apart.

    The CSV has columns `phase,tokens,context,time_s`: for `prefill` rows `tokens` is the tokens
    computed and `context` the KV tokens the iteration reads (the cached prefix its chunks attend
    to), as operator profiles are taken (chunk x KV cache size); for `decode` rows `tokens` is the
    batch and `context` the KV tokens each request reads. Each phase is a full grid over (tokens,
    context). An iteration outside a grid is refused (an InputError naming the table and the
    cell), never clamped. A mixed iteration is priced on the prefill grid at all its tokens and
    all the KV it reads.
    """

    @classmethod
    def from_config(cls, model: ModelSpec, gpu: GpuSpec, tp: int, perf: Perf,
                    base_dir: Path = Path("."), dp: int = 1, ep: int = 1,
                    known: Catalog = BUNDLED) -> MeasuredTable:
        """The config's table (a path relative to the config); the same times for every GPU."""
        assert perf.table is not None       # the config requires it for kind 'table'
        return cls(base_dir / perf.table)

    def __init__(self, path: Path):
        self.path = path
        rows: dict[str, list[tuple[float, float, float]]] = {"prefill": [], "decode": []}
        try:
            with open(path, newline="") as f:
                for line, r in enumerate(csv.DictReader(f), start=2):
                    try:
                        rows[r["phase"]].append((float(r["tokens"]), float(r["context"]),
                                                 float(r["time_s"])))
                    except (KeyError, ValueError, TypeError) as e:
                        raise InputError(f"{path}:{line}: perf table needs columns phase (prefill or "
                                         f"decode),tokens,context,time_s ({e})") from None
        except OSError as e:
            raise InputError(f"{path}: cannot read perf table ({e.strerror})") from None
        self.grids = {phase: _Grid(path, phase, points) for phase, points in rows.items()}

    def iteration(self, tokens: int, attn_pairs: float, kv_tokens_read: float,
                  decode_pairs: float = 0.0, requests: float | None = None,
                  samples: float | None = None, largest: float | None = None) -> float:
        return float(self.iterations(tokens, attn_pairs, kv_tokens_read, decode_pairs))

    def iterations(self, tokens, attn_pairs, kv_tokens_read, decode_pairs=0.0,
                   requests=None, samples=None, largest=None) -> np.ndarray:
        out = np.empty(np.broadcast(tokens, attn_pairs, kv_tokens_read, decode_pairs).shape)
        for grid, where, t, ctx in self._cells(tokens, attn_pairs, kv_tokens_read, decode_pairs):
            out[where] = grid.at(t, ctx)
        return out

    def covers(self, tokens, attn_pairs, kv_tokens_read, decode_pairs=0.0) -> np.ndarray:
        """Which iterations lie inside the measured grids (the others `iterations` refuses)."""
        out = np.empty(np.broadcast(tokens, attn_pairs, kv_tokens_read, decode_pairs).shape, bool)
        for grid, where, t, ctx in self._cells(tokens, attn_pairs, kv_tokens_read, decode_pairs):
            out[where] = grid.inside(t, ctx)
        return out

    def _cells(self, tokens, attn_pairs, kv_tokens_read, decode_pairs):
        """Per phase: its grid, which iterations are of that phase, and their grid coordinates."""
        tokens, pairs, kv, dec = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (
            tokens, attn_pairs, kv_tokens_read, decode_pairs)))
        decode = dec >= pairs                                  # every token a decode
        if decode.any():
            yield self.grids["decode"], decode, tokens[decode], kv[decode] / tokens[decode]
        if (~decode).any():
            yield self.grids["prefill"], ~decode, tokens[~decode], kv[~decode]

    def decode_run(self, n: int, context: int, k: int) -> TabulatedRun:
        per_request = context / n + np.arange(k, dtype=float)
        return TabulatedRun(self.grids["decode"].at(np.full(k, float(n)), per_request))


class _Grid:
    """One phase's full grid of measured times over (tokens, context), bilinear inside."""

    def __init__(self, path: Path, phase: str, points: list[tuple[float, float, float]]):
        self.where = f"{path}: {phase}"
        self.tok = np.unique([p[0] for p in points])
        self.ctx = np.unique([p[1] for p in points])
        grid = {(p[0], p[1]): p[2] for p in points}
        missing = [(t, c) for t in self.tok for c in self.ctx if (t, c) not in grid]
        if not points or missing or len(grid) != len(points):
            cell = f"; missing tokens={missing[0][0]:g} context={missing[0][1]:g}" if missing else ""
            raise InputError(f"{self.where} rows must be a full grid of tokens x context, each cell "
                             f"once{cell}")
        self.time = np.array([[grid[(t, c)] for c in self.ctx] for t in self.tok])

    def inside(self, tokens: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        return ((tokens >= self.tok[0]) & (tokens <= self.tok[-1])
                & (ctx >= self.ctx[0] - 1e-9) & (ctx <= self.ctx[-1] + 1e-9))

    def at(self, tokens: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        outside = ~self.inside(tokens, ctx)
        if outside.any():
            i = int(np.argmax(outside))
            raise InputError(
                f"{self.where} iteration of {tokens[i]:g} tokens at context {ctx[i]:g} is outside "
                f"the measured range (tokens {self.tok[0]:g}-{self.tok[-1]:g}, context "
                f"{self.ctx[0]:g}-{self.ctx[-1]:g})")
        return _bilinear(self.tok, self.ctx, self.time, tokens, np.clip(ctx, self.ctx[0], self.ctx[-1]))


def _bilinear(xs, ys, grid, x, y):
    """Bilinear interpolation of grid[xs, ys] at points (x, y) inside the grid."""
    xi = np.clip(np.searchsorted(xs, x, side="right") - 1, 0, max(len(xs) - 2, 0))
    yi = np.clip(np.searchsorted(ys, y, side="right") - 1, 0, max(len(ys) - 2, 0))
    xj, yj = np.minimum(xi + 1, len(xs) - 1), np.minimum(yi + 1, len(ys) - 1)
    fx = np.where(xj > xi, (x - xs[xi]) / np.where(xj > xi, xs[xj] - xs[xi], 1), 0)
    fy = np.where(yj > yi, (y - ys[yi]) / np.where(yj > yi, ys[yj] - ys[yi], 1), 0)
    return ((1 - fx) * (1 - fy) * grid[xi, yi] + fx * (1 - fy) * grid[xj, yi]
            + (1 - fx) * fy * grid[xi, yj] + fx * fy * grid[xj, yj])


class LinearRun:
    """A run of k decode iterations, t(i) = max(compute(i), memory(i)) + fixed, each term a + b*i
    given as (a, b), in closed form: the two terms cross at most once, so any prefix sum is two
    arithmetic series, the `early` term's over [0, split) and the `late` one's over the rest. It
    is priced once per segment and asked many times (routers see a run under way): hot code."""

    __slots__ = ("ca", "cb", "ma", "mb", "fixed", "k", "ea", "eb", "la", "lb", "split",
                 "first_s", "total_s")

    def __init__(self, compute: tuple[float, float], memory: tuple[float, float], fixed: float,
                 k: int):
        # one tuple unpacked at a time: compiled, that is native (a nested unpack iterates)
        ca, cb = compute
        ma, mb = memory
        self.ca, self.cb, self.ma, self.mb, self.fixed, self.k = ca, cb, ma, mb, fixed, k
        da, db = ca - ma, cb - mb
        if db == 0:                            # no crossing: `early` dominates all k
            early, late, split = (compute if da >= 0 else memory), (0.0, 0.0), k
        elif db > 0:
            early, late = memory, compute
            split = min(max(ceil(-da / db), 0), k)
        else:
            early, late = compute, memory
            split = min(max(floor(-da / db) + 1, 0), k)
        self.ea, self.eb = early
        self.la, self.lb = late
        self.split = split
        self.first_s = (ca if ca > ma else ma) + fixed        # at(0)
        self.total_s = self.elapsed(k)

    def at(self, i: int) -> float:
        c = self.ca + self.cb * i
        m = self.ma + self.mb * i
        return (c if c > m else m) + self.fixed

    def elapsed(self, m: int) -> float:
        """Time of the first m iterations."""
        j = self.split if self.split < m else m
        body = j * self.ea + self.eb * (j - 1) * j / 2 if j > 0 else 0.0
        if m > j:                              # the late term's sum over [j, m)
            n = m - j
            body += n * self.la + self.lb * (j + m - 1) * n / 2
        return body + m * self.fixed

    def longest(self, m: int) -> float:
        """The longest of the first m iterations: both terms only grow, so the last."""
        return self.at(m - 1)

    def cut(self, t: float) -> int:
        """Iterations finished at the first iteration boundary at or after time t: the smallest
        m in [1, k] with elapsed(m) >= t (k if none). A closed-form guess (where elapsed(m) = t,
        solved as a quadratic on the term's segment it falls in) brackets it, the exact prefix
        sums decide."""
        k, s, elapsed = self.k, self.split, self.elapsed
        g = _quadratic_root(self.ea + self.fixed, self.eb, t) if s else 0.0
        if g >= s and s < k:
            g = s + _quadratic_root(self.la + self.lb * s + self.fixed, self.lb,
                                    max(t - elapsed(s), 0.0) if s else t)
        m = max(ceil(g if g < k else k), 1)
        lo, hi = 1, k
        if elapsed(m) >= t:
            if m == 1 or elapsed(m - 1) < t:
                return m
            hi = m - 1
        else:
            lo = m + 1 if m < hi else hi
        while lo < hi:
            mid = (lo + hi) // 2
            if elapsed(mid) >= t:
                hi = mid
            else:
                lo = mid + 1
        return lo


class FlooredRun:
    """A run whose iterations take at least `floor` each: t(i) = max(run.at(i), floor). The run's
    times only grow, so the floor holds the first `held` iterations and the run the rest."""

    __slots__ = ("run", "floor", "held", "k", "first_s", "total_s")

    def __init__(self, run: LinearRun, floor: float):
        self.run, self.floor, self.k = run, floor, run.k
        # held: the first i with run.at(i) >= floor
        self.held = bisect_left(range(run.k), True, key=lambda i: run.at(i) >= floor)
        self.first_s = self.at(0)
        self.total_s = self.elapsed(run.k)

    def at(self, i: int) -> float:
        return self.floor if i < self.held else self.run.at(i)

    def elapsed(self, m: int) -> float:
        """Time of the first m iterations."""
        j = min(m, self.held)
        return j * self.floor + (self.run.elapsed(m) - self.run.elapsed(j) if m > j else 0.0)

    def longest(self, m: int) -> float:
        return self.at(m - 1)

    def cut(self, t: float) -> int:
        """The smallest m in [1, k] with elapsed(m) >= t (k if none): a guess from the floor or
        from the run's own cut, then corrected on the exact prefix sums."""
        if t <= self.held * self.floor:
            m = ceil(t / self.floor)
        else:
            m = self.run.cut(t - self.held * self.floor + self.run.elapsed(self.held))
        m = min(max(m, 1), self.k)
        while m < self.k and self.elapsed(m) < t:
            m += 1
        while m > 1 and self.elapsed(m - 1) >= t:
            m -= 1
        return m


def _quadratic_root(a: float, b: float, t: float) -> float:
    """m >= 0 with a*m + b*m*(m-1)/2 = t (iterations of times a, a+b, ... adding up to t)."""
    if b <= 0:
        return t / a if a > 0 else 0.0
    p = a - b / 2                              # b/2 m^2 + p m - t = 0
    return (-p + max(p * p + 2 * b * t, 0.0) ** 0.5) / b


class TabulatedRun:
    """A run of decode iterations whose times are given one by one (measured-table model)."""

    __slots__ = ("times", "cum", "k", "first_s", "total_s")

    def __init__(self, times: np.ndarray):
        self.times = times
        self.cum = np.cumsum(times)
        self.k = len(times)
        self.first_s = float(times[0])
        self.total_s = float(self.cum[-1])

    def elapsed(self, m: int) -> float:
        return float(self.cum[m - 1]) if m else 0.0

    def longest(self, m: int) -> float:
        return float(self.times[:m].max())

    def cut(self, t: float) -> int:
        return min(int(np.searchsorted(self.cum, t, side="left")) + 1, self.k)


# name -> model; the config's Literal is checked against these names (tests/test_registries.py)
PERF_MODELS: dict[str, type[Roofline] | type[MeasuredTable]] = {
    "roofline": Roofline, "table": MeasuredTable}
