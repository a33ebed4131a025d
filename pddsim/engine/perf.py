"""How long one batch iteration takes on an instance.

The roofline model (default) prices an iteration as the larger of its compute time and its HBM time,
plus tensor-parallel all-reduces and a fixed per-iteration overhead. Weights are read once per
iteration, so a small prefill chunk pays the same weight read as a large one: that is what makes
unbatched tail chunks expensive. Every running request's KV is read too, so decode slows as contexts
grow. The table model replaces the roofline by measured iteration times interpolated from a CSV.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pddsim.catalog import EngineProfile, GpuSpec, ModelSpec
from pddsim.errors import InputError

if TYPE_CHECKING:
    from pddsim.config import Perf

ACT_BYTES = 2.0  # activations travel in BF16 in the tensor-parallel all-reduces


class Roofline:
    """Roofline iteration time for `model` on `tp` GPUs of type `gpu`, served by `engine`."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int, engine: EngineProfile):
        # the matmuls run in the compute dtype (W4A16 dequantises to 16-bit): it sets the peak
        fp8 = model.compute_dtype == "fp8"
        linear_flops = tp * (gpu.fp8_tflops if fp8 else gpu.bf16_tflops) * 1e12 \
            * (engine.linear_fp8 if fp8 else engine.linear_bf16)
        attn_peak = tp * gpu.bf16_tflops * 1e12                 # attention kernels run in 16-bit
        self.s_per_token = 2.0 * model.active_params_b * 1e9 / linear_flops
        self.s_per_prefill_pair = model.prefill_attn_flops / (attn_peak * engine.attn_prefill)
        self.s_per_decode_pair = model.decode_attn_flops / (attn_peak * engine.attn_decode)
        bytes_per_s = tp * gpu.hbm_tbps * 1e12 * engine.memory
        self.s_per_kv_token = model.kv_bytes_per_token / bytes_per_s
        self.shared_s = model.shared_weight_bytes / bytes_per_s
        self.routed_s = (model.weight_bytes - model.shared_weight_bytes) / bytes_per_s
        self.pick_share = model.routed_pick_share
        # two all-reduces per layer; a ring moves 2(n-1)/n of the payload over one direction of
        # each GPU's link at the measured bus bandwidth, in 2(n-1) latency-bound steps
        allreduces = 2 * model.layers
        self.comm_s_per_token = (0.0 if tp == 1 else allreduces * 2 * (tp - 1) / tp
                                 * model.hidden_size * ACT_BYTES / (gpu.allreduce_bus_gbps * 1e9))
        latency_s = (engine.allreduce_base_us + engine.allreduce_step_us * 2 * (tp - 1)) / 1e6
        self.fixed_s = engine.overhead_ms / 1e3 + (0.0 if tp == 1 else allreduces * latency_s)

    @classmethod
    def from_config(cls, model: ModelSpec, gpu: GpuSpec, tp: int, perf: "Perf") -> "Roofline":
        return cls(model, gpu, tp, perf.engine())

    def weights_read_s(self, tokens):
        """Time to read the weights one iteration needs: the shared part always; a MoE touches
        more routed experts as the batch grows (each token picks its share independently)."""
        return self.shared_s + self.routed_s * (1.0 - (1.0 - self.pick_share) ** tokens)

    def iteration(self, tokens: int, attn_pairs: float, kv_tokens_read: float,
                  decode_pairs: float = 0.0) -> float:
        """Time of one iteration: `tokens` computed, `attn_pairs` query x context token pairs
        attended (`decode_pairs` of them by decode tokens, which attend in the absorbed form),
        `kv_tokens_read` tokens of KV cache read."""
        compute = (tokens * self.s_per_token + (attn_pairs - decode_pairs) * self.s_per_prefill_pair
                   + decode_pairs * self.s_per_decode_pair)
        memory = self.weights_read_s(tokens) + kv_tokens_read * self.s_per_kv_token
        return max(compute, memory) + tokens * self.comm_s_per_token + self.fixed_s

    def iterations(self, tokens: np.ndarray, attn_pairs: np.ndarray,
                   kv_tokens_read: np.ndarray, decode_pairs=0.0) -> np.ndarray:
        """`iteration` over arrays: many independent iterations at once."""
        tokens = np.asarray(tokens, dtype=float)
        attn_pairs, decode_pairs = np.asarray(attn_pairs), np.asarray(decode_pairs)
        compute = (tokens * self.s_per_token + (attn_pairs - decode_pairs) * self.s_per_prefill_pair
                   + decode_pairs * self.s_per_decode_pair)
        memory = self.weights_read_s(tokens) + np.asarray(kv_tokens_read) * self.s_per_kv_token
        return np.maximum(compute, memory) + tokens * self.comm_s_per_token + self.fixed_s

    def decode_run(self, n: int, context: int, k: int) -> "LinearRun":
        """k decode iterations of n requests holding `context` KV tokens at the first, growing by
        n tokens an iteration: both roofline terms are linear in the iteration index."""
        compute = LinearTerm(n * self.s_per_token + context * self.s_per_decode_pair,
                             n * self.s_per_decode_pair)
        memory = LinearTerm(self.weights_read_s(n) + context * self.s_per_kv_token,
                            n * self.s_per_kv_token)
        return LinearRun(compute, memory, n * self.comm_s_per_token + self.fixed_s, k)


class MeasuredTable:
    """Iteration times measured on real hardware, bilinear in (batch tokens, KV tokens read).

    The CSV has columns `tokens,kv_tokens,time_s` on a full grid; outside it values are clamped.
    """

    def __init__(self, path: Path):
        try:
            with open(path, newline="") as f:
                rows = [(float(r["tokens"]), float(r["kv_tokens"]), float(r["time_s"]))
                        for r in csv.DictReader(f)]
        except (OSError, KeyError, ValueError, TypeError) as e:
            raise InputError(f"{path}: perf table needs columns tokens,kv_tokens,time_s ({e})") from None
        self.tok = np.unique([r[0] for r in rows])
        self.kv = np.unique([r[1] for r in rows])
        if len(rows) != len(self.tok) * len(self.kv):
            raise InputError(f"{path}: perf table must be a full grid of tokens x kv_tokens")
        grid = {(r[0], r[1]): r[2] for r in rows}
        self.time = np.array([[grid[(t, k)] for k in self.kv] for t in self.tok])

    def iteration(self, tokens: int, attn_pairs: float, kv_tokens_read: float,
                  decode_pairs: float = 0.0) -> float:
        return float(self.iterations(tokens, attn_pairs, kv_tokens_read))

    def iterations(self, tokens, attn_pairs, kv_tokens_read, decode_pairs=0.0) -> np.ndarray:
        return self._interpolate(np.asarray(tokens, dtype=float),
                                 np.asarray(kv_tokens_read, dtype=float))

    def decode_run(self, n: int, context: int, k: int) -> "TabulatedRun":
        ctx = context + n * np.arange(k, dtype=float)
        return TabulatedRun(self._interpolate(np.full(k, float(n)), ctx))

    def _interpolate(self, tokens: np.ndarray, kv: np.ndarray):
        tokens, kv = np.broadcast_arrays(tokens, kv)
        ti = np.clip(np.searchsorted(self.tok, tokens) - 1, 0, max(len(self.tok) - 2, 0))
        ki = np.clip(np.searchsorted(self.kv, kv) - 1, 0, max(len(self.kv) - 2, 0))
        t0, t1 = self.tok[ti], self.tok[np.minimum(ti + 1, len(self.tok) - 1)]
        k0, k1 = self.kv[ki], self.kv[np.minimum(ki + 1, len(self.kv) - 1)]
        ft = np.clip(np.where(t1 > t0, (tokens - t0) / np.where(t1 > t0, t1 - t0, 1), 0), 0, 1)
        fk = np.clip(np.where(k1 > k0, (kv - k0) / np.where(k1 > k0, k1 - k0, 1), 0), 0, 1)
        g = self.time
        ti1, ki1 = np.minimum(ti + 1, len(self.tok) - 1), np.minimum(ki + 1, len(self.kv) - 1)
        out = ((1 - ft) * (1 - fk) * g[ti, ki] + ft * (1 - fk) * g[ti1, ki]
               + (1 - ft) * fk * g[ti, ki1] + ft * fk * g[ti1, ki1])
        return out


class LinearTerm:
    """a + b*i: one roofline term over the iterations of a decode run."""

    __slots__ = ("a", "b")

    def __init__(self, a: float, b: float):
        self.a, self.b = a, b

    def sum(self, lo: int, hi: int) -> float:
        """Sum over i in [lo, hi)."""
        m = hi - lo
        return m * self.a + self.b * (lo + hi - 1) * m / 2 if m > 0 else 0.0


class LinearRun:
    """A run of k decode iterations, t(i) = max(compute(i), memory(i)) + fixed, in closed form:
    the two terms cross at most once, so any prefix sum is two arithmetic series."""

    __slots__ = ("compute", "memory", "fixed", "k", "early", "late", "split", "first_s", "total_s")

    def __init__(self, compute: LinearTerm, memory: LinearTerm, fixed: float, k: int):
        self.compute, self.memory, self.fixed, self.k = compute, memory, fixed, k
        # `early` dominates iterations [0, split), `late` the rest
        da, db = compute.a - memory.a, compute.b - memory.b
        if db == 0:
            self.early, self.late, self.split = (compute if da >= 0 else memory), None, k
        elif db > 0:
            self.early, self.late = memory, compute
            self.split = min(max(int(np.ceil(-da / db)), 0), k)
        else:
            self.early, self.late = compute, memory
            self.split = min(max(int(np.floor(-da / db)) + 1, 0), k)
        self.first_s = self.at(0)
        self.total_s = self.elapsed(k)

    def at(self, i: int) -> float:
        c = self.compute.a + self.compute.b * i
        m = self.memory.a + self.memory.b * i
        return (c if c > m else m) + self.fixed

    def elapsed(self, m: int) -> float:
        """Time of the first m iterations."""
        j = min(self.split, m)
        body = self.early.sum(0, j) + (self.late.sum(j, m) if m > j else 0.0)
        return body + m * self.fixed

    def longest(self, m: int) -> float:
        """The longest of the first m iterations: both terms only grow, so the last."""
        return self.at(m - 1)

    def cut(self, t: float) -> int:
        """Iterations finished at the first iteration boundary at or after time t."""
        lo, hi = 1, self.k
        while lo < hi:
            mid = (lo + hi) // 2
            if self.elapsed(mid) >= t:
                hi = mid
            else:
                lo = mid + 1
        return lo


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
