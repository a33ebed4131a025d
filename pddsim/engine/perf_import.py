"""Convert published profile formats into a measured table (`MeasuredTable`'s CSV) with a
provenance sidecar. The files are the user's: nothing of them is bundled.

* `distserve`: DistServe's profile JSON (`{model: {tp: {"prefill": [a, b, c], "decoding_smallbs":
  [a, b, c], "decoding_largebs": [a, b, c], "decoding_large_small_bs_threshold": n}}}`, ms):
  prefill = a + b x tokens + c x sum of squared prompt lengths, decode = a + b x context tokens of
  the batch + c x batch. Fits, so the table samples them on a grid of chunk tokens x prefix KV
  tokens (a chunk of t over a prefix of P counts t^2 + 2tP as its squared length) and reproduces
  them at every cell.
* `vidur`: Vidur's operator profiles, `mlp.csv` (per-layer operator times by `num_tokens` and
  `num_tensor_parallel_workers`) and `attention.csv` (`time_stats.attn_prefill.median` by
  `prefill_chunk_size` and `kv_cache_size`, `time_stats.attn_decode.median` by `batch_size` and
  `kv_cache_size`), optionally `all_reduce.csv` (`time_stats.all_reduce.median` by `size` in FP16
  elements and `num_workers`): an iteration is the layers' operators plus attention plus two
  all-reduces per layer, on the grid the profiles were taken on.
* `splitwise`: SplitwiseSim's `perf_model.csv` (`prompt_time` of `batch_size` prompts of
  `prompt_size` tokens, `token_time` of one decode iteration, ms; prefill from the single-prompt
  rows). Its published decode points do not form a full grid of batch x context (batch 1 over many
  contexts, larger batches at one), so such a file is refused, naming a missing cell; its points
  remain usable as measured iterations for `pddsim bench perf`.
"""
from __future__ import annotations

import csv
import hashlib
import json
import re
from pathlib import Path

import numpy as np

from pddsim import catalog
from pddsim.engine.perf import MeasuredTable
from pddsim.errors import InputError

PREFILL_TOKENS = (1, 16, 64, 256, 512, 1024, 2048, 4096, 8192)
PREFILL_CONTEXT = (0, 256, 512, 1024, 2048, 4096)
DECODE_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DECODE_CONTEXT = (1, 256, 512, 1024, 2048, 4096, 8192)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().rsplit("/", 1)[-1])


def _read_csv(path: Path) -> list[dict]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None


def _num(path: Path, line: int, row: dict, column: str) -> float:
    try:
        return float(row[column])
    except (KeyError, ValueError, TypeError):
        raise InputError(f"{path}:{line}: column {column!r} missing or not a number") from None


def from_distserve(files: list[Path], model: str, tp: int, source_model: str | None) -> list[tuple]:
    path = files[0]
    try:
        profile = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable JSON profile ({e})") from None
    want = _norm(source_model or model)
    key = next((k for k in profile if _norm(k) == want), None)
    if key is None or str(tp) not in profile[key]:
        raise InputError(f"{path}: no profile for model {source_model or model!r} at tp {tp} "
                         f"(has {', '.join(f'{k} tp {sorted(v)}' for k, v in profile.items())})")
    p = profile[key][str(tp)]
    try:
        a, b, c = (float(x) for x in p["prefill"])
        small, large = p["decoding_smallbs"], p["decoding_large_small_bs_threshold"]
        large_fit = p["decoding_largebs"]
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"{path}: {key} tp {tp}: malformed profile ({e})") from None
    # one chunk of t tokens over a prefix of P: sum L^2 = 2 x pairs = t^2 + 2 t P
    rows = [("prefill", t, kv, (a + b * t + c * (t * t + 2 * t * kv)) / 1e3)
            for t in PREFILL_TOKENS for kv in PREFILL_CONTEXT]
    for n in DECODE_BATCH:
        da, db, dc = (float(x) for x in (small if n < large else large_fit))
        rows += [("decode", n, ctx, (da + db * n * ctx + dc * n) / 1e3) for ctx in DECODE_CONTEXT]
    return rows


VIDUR_LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
                   "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


def from_vidur(files: list[Path], model: str, tp: int, source_model: str | None) -> list[tuple]:
    by_name = {f.name: f for f in files}
    if "mlp.csv" not in by_name or "attention.csv" not in by_name:
        raise InputError("vidur import needs mlp.csv and attention.csv (all_reduce.csv optional)")
    spec = catalog.model(model)
    linear = {}                                   # num_tokens -> one layer's operators, ms
    for line, r in enumerate(_read_csv(by_name["mlp.csv"]), start=2):
        if int(_num(by_name["mlp.csv"], line, r, "num_tensor_parallel_workers")) != tp:
            continue
        t = _num(by_name["mlp.csv"], line, r, "num_tokens")
        linear[t] = sum(_num(by_name["mlp.csv"], line, r, f"time_stats.{op}.median")
                        for op in VIDUR_LAYER_OPS if f"time_stats.{op}.median" in r)
    prefill, decode = {}, {}
    att = by_name["attention.csv"]
    for line, r in enumerate(_read_csv(att), start=2):
        if ("num_tensor_parallel_workers" in r
                and int(_num(att, line, r, "num_tensor_parallel_workers")) != tp):
            continue
        chunk, kv = _num(att, line, r, "prefill_chunk_size"), _num(att, line, r, "kv_cache_size")
        if chunk > 0:
            prefill[chunk, kv] = _num(att, line, r, "time_stats.attn_prefill.median")
        else:
            n = _num(att, line, r, "batch_size")
            decode[n, kv] = _num(att, line, r, "time_stats.attn_decode.median")
    allreduce = _vidur_allreduce(by_name.get("all_reduce.csv"), tp)
    if not linear:
        raise InputError(f"{by_name['mlp.csv']}: no rows at num_tensor_parallel_workers {tp}")

    def layer_ms(tokens: float) -> float:
        if tokens not in linear:
            raise InputError(f"{by_name['mlp.csv']}: no operator profile at num_tokens {tokens:g} "
                             f"(attention was profiled there)")
        return linear[tokens] + 2 * allreduce(tokens * spec.hidden_size)

    rows = [("prefill", t, ctx, spec.layers * (layer_ms(t) + ms) / 1e3)
            for (t, ctx), ms in sorted(prefill.items())]
    rows += [("decode", n, kv, spec.layers * (layer_ms(n) + ms) / 1e3)
             for (n, kv), ms in sorted(decode.items())]
    return rows


def _vidur_allreduce(path: Path | None, tp: int):
    """All-reduce ms by message size (FP16 elements), interpolated in log size; none at TP1."""
    if tp == 1 or path is None:
        if tp > 1:
            raise InputError("vidur import at tp > 1 needs all_reduce.csv")
        return lambda elements: 0.0
    points = sorted((_num(path, i, r, "size"), _num(path, i, r, "time_stats.all_reduce.median"))
                    for i, r in enumerate(_read_csv(path), start=2)
                    if int(_num(path, i, r, "num_workers")) == tp)
    if not points:
        raise InputError(f"{path}: no rows at num_workers {tp}")
    sizes, ms = np.log([p[0] for p in points]), np.array([p[1] for p in points])

    def at(elements: float) -> float:
        x = np.log(elements)
        if x < sizes[0] or x > sizes[-1]:
            raise InputError(f"{path}: all-reduce of {elements:g} elements outside the profile")
        return float(np.interp(x, sizes, ms))
    return at


def from_splitwise(files: list[Path], model: str, tp: int, source_model: str | None,
                   source_gpu: str) -> list[tuple]:
    rows, path = [], files[0]
    model_key, gpu_key = _norm(source_model or model), _norm(source_gpu)
    groups: dict[tuple, list[float]] = {}
    for line, r in enumerate(_read_csv(path), start=2):
        if _norm(r.get("model", "")) != model_key or _norm(r.get("hardware", "")) != gpu_key:
            continue
        if int(_num(path, line, r, "tensor_parallel")) != tp:
            continue
        b, p, o = (_num(path, line, r, c) for c in ("batch_size", "prompt_size", "token_size"))
        if b == 1:                  # a batch of prompts is not one prefill of as many tokens
            groups.setdefault(("prefill", p, 0), []).append(_num(path, line, r, "prompt_time"))
        groups.setdefault(("decode", b, p + o / 2), []).append(_num(path, line, r, "token_time"))
    if not groups:
        raise InputError(f"{path}: no rows for model {source_model or model!r} on "
                         f"{source_gpu!r} at tensor_parallel {tp}")
    for (phase, t, ctx), times in sorted(groups.items()):
        rows.append((phase, t, ctx, float(np.median(times)) / 1e3))       # repeated runs: median
    return rows


SOURCES = ("distserve", "splitwise", "vidur")


def import_table(source: str, files: list[Path], out: Path, *, model: str, gpu: str, tp: int,
                 source_model: str | None = None, source_gpu: str | None = None,
                 commit: str | None = None, licence: str | None = None) -> dict:
    """Write `out` (a measured table) and `out`.provenance.json; return the provenance. The table is
    loaded back before it is kept, so a table that is not a full grid is refused here."""
    catalog.model(model), catalog.gpu(gpu)
    if source == "distserve":
        rows = from_distserve(files, model, tp, source_model)
    elif source == "vidur":
        rows = from_vidur(files, model, tp, source_model)
    elif source == "splitwise":
        rows = from_splitwise(files, model, tp, source_model, source_gpu or gpu)
    else:
        raise InputError(f"unknown profile format {source!r}; known: {', '.join(SOURCES)}")
    tmp = out.with_name(out.name + ".part")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["phase", "tokens", "context", "time_s"])
        w.writerows((phase, f"{t:g}", f"{ctx:g}", repr(time_s)) for phase, t, ctx, time_s in rows)
    try:
        MeasuredTable(tmp)
    except InputError as e:
        tmp.unlink()
        raise InputError(f"{source} profile does not make a table: {e}") from None
    tmp.replace(out)
    provenance = {"source": source, "files": [{"name": f.name, "sha256": hashlib.sha256(
        f.read_bytes()).hexdigest()} for f in files], "commit": commit, "licence": licence,
        "model": model, "gpu": gpu, "tp": tp, "cells": len(rows)}
    Path(str(out) + ".provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
    return provenance
