"""How long one batch iteration takes on an instance.

The roofline model (default) prices an iteration as the larger of its compute time and its HBM time,
plus tensor-parallel all-reduces and a fixed per-iteration overhead; an eager engine's GPU work
cannot go faster than its host launches the kernels (a floor per layer). Weights are read once per
iteration, so a small prefill chunk pays the same weight read as a large one: that is what makes
unbatched tail chunks expensive. Every running request's KV is read too, so decode slows as contexts
grow. The table model replaces the roofline by measured iteration times interpolated from a CSV.
"""
from __future__ import annotations

import csv
from bisect import bisect_left
from math import ceil, floor
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from pddsim.catalog import EngineProfile, GpuSpec, ModelSpec
from pddsim.errors import InputError

if TYPE_CHECKING:
    from pddsim.config import Perf

ACT_BYTES = 2.0  # activations travel in BF16 in the tensor-parallel all-reduces


class DecodeRun(Protocol):
    """k decode iterations of a fixed batch, priced at once: how long the first m take, the longest
    of them, and how many end by time t."""

    def elapsed(self, m: int) -> float: ...
    def longest(self, m: int) -> float: ...
    def cut(self, t: float) -> int: ...


class PerfModel(Protocol):
    """The seam an instance prices its iterations through (`perf.kind` in the config)."""

    def iteration(self, tokens: int, attn_pairs: float, kv_tokens_read: float,
                  decode_pairs: float = 0.0) -> float: ...
    def iterations(self, tokens: np.ndarray, attn_pairs: np.ndarray, kv_tokens_read: np.ndarray,
                   decode_pairs: np.ndarray | float = 0.0) -> np.ndarray: ...
    def decode_run(self, n: int, context: int, k: int) -> DecodeRun: ...


class Roofline:
    """Roofline iteration time for `model` on `tp` GPUs of type `gpu`, served by `engine`."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int, engine: EngineProfile):
        # the weights' dtype sets the matmuls' peak (W4A16 dequantises to 16-bit)
        fp8 = model.weight_dtype == "fp8" and gpu.fp8_tflops > gpu.bf16_tflops
        linear_flops = tp * gpu.peak_tflops(model.weight_dtype) * 1e12 \
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
        # An eager engine's host launches every kernel of a layer one by one while the GPU runs
        # them asynchronously: the slower of the two paces each layer, and the layers are alike,
        # so the GPU work (all-reduces included) cannot take less than layers x the host's launch
        # time. Each TP worker launches the same kernels on its own CPU core: the floor does not
        # shrink with TP. The per-iteration overhead (scheduling, input preparation, sampling)
        # runs before the launches and adds to either. 0: no floor (graph-captured engines
        # launch one graph per iteration), and no cost.
        host_s = engine.host_layer_s(gpu.name) * model.layers
        self.floor_s = host_s + engine.overhead_ms / 1e3 if host_s else 0.0

    @classmethod
    def from_config(cls, model: ModelSpec, gpu: GpuSpec, tp: int, perf: Perf,
                    base_dir: Path = Path(".")) -> Roofline:
        """The roofline under a config's `perf`: its profile with its overrides."""
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
        t = max(compute, memory) + tokens * self.comm_s_per_token + self.fixed_s
        return t if t >= self.floor_s else self.floor_s

    def iterations(self, tokens: np.ndarray, attn_pairs: np.ndarray,
                   kv_tokens_read: np.ndarray, decode_pairs=0.0) -> np.ndarray:
        """`iteration` over arrays: many independent iterations at once."""
        tokens = np.asarray(tokens, dtype=float)
        attn_pairs, decode_pairs = np.asarray(attn_pairs), np.asarray(decode_pairs)
        compute = (tokens * self.s_per_token + (attn_pairs - decode_pairs) * self.s_per_prefill_pair
                   + decode_pairs * self.s_per_decode_pair)
        memory = self.weights_read_s(tokens) + np.asarray(kv_tokens_read) * self.s_per_kv_token
        t = np.maximum(compute, memory) + tokens * self.comm_s_per_token + self.fixed_s
        return np.maximum(t, self.floor_s) if self.floor_s else t

    def decode_run(self, n: int, context: int, k: int) -> LinearRun | FlooredRun:
        """k decode iterations of n requests holding `context` KV tokens at the first, growing by
        n tokens an iteration: both roofline terms are linear in the iteration index, and the
        host floor, when it binds, binds the first iterations (the terms only grow)."""
        compute = (n * self.s_per_token + context * self.s_per_decode_pair, n * self.s_per_decode_pair)
        memory = (self.weights_read_s(n) + context * self.s_per_kv_token, n * self.s_per_kv_token)
        run = LinearRun(compute, memory, n * self.comm_s_per_token + self.fixed_s, k)
        return FlooredRun(run, self.floor_s) if run.first_s < self.floor_s else run


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
                    base_dir: Path = Path(".")) -> MeasuredTable:
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
                  decode_pairs: float = 0.0) -> float:
        return float(self.iterations(tokens, attn_pairs, kv_tokens_read, decode_pairs))

    def iterations(self, tokens, attn_pairs, kv_tokens_read, decode_pairs=0.0) -> np.ndarray:
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
        (ca, cb), (ma, mb) = compute, memory
        self.ca, self.cb, self.ma, self.mb, self.fixed, self.k = ca, cb, ma, mb, fixed, k
        da, db = ca - ma, cb - mb
        if db == 0:                            # no crossing: `early` dominates all k
            (self.ea, self.eb), split = (compute if da >= 0 else memory), k
            late = (0.0, 0.0)
        elif db > 0:
            (self.ea, self.eb), late = memory, compute
            split = min(max(ceil(-da / db), 0), k)
        else:
            (self.ea, self.eb), late = compute, memory
            split = min(max(floor(-da / db) + 1, 0), k)
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
        g = max(ceil(g if g < k else k), 1)
        lo, hi = 1, k
        if elapsed(g) >= t:
            if g == 1 or elapsed(g - 1) < t:
                return g
            hi = g - 1
        else:
            lo = g + 1 if g < hi else hi
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
