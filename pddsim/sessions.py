"""Per-session results: how long each agent task took, from its first request to its last reply,
and its slowdown against an ideal run of the same task on an idle deployment.

In closed loop every delay a request meets pushes back all the turns after it, so an agent feels the
system through its whole task, not through one request. The slowdown separates that from the work
the task cannot avoid: its requests' own service and its think times.
"""
from __future__ import annotations

from itertools import product

import numpy as np
import pandas as pd
import simpy

from pddsim.config import Config
from pddsim.engine.perf import chunk_attention_pairs
from pddsim.errors import InputError
from pddsim.intmath import ceil_div
from pddsim.system.deployment import Deployment, build
from pddsim.workload.model import Workload

COLUMNS = ["session", "requests", "start_s", "end_s", "completion_s", "ideal_s", "slowdown"]
PERCENTILES = (50, 90)


def session_table(cfg: Config, workload: Workload, requests: pd.DataFrame) -> pd.DataFrame:
    """One row per session of `requests` (a run's per-request frame); requests without a session
    are left out. `ideal_s` is the task's completion with every request served alone
    (`ideal_service_s`) and the dependencies kept: in closed loop a request leaves `think_s` after
    the one it follows has finished, so the session ends with its longest path through its
    sub-agents; a root leaves when the replay sent it, which does not depend on the system."""
    df = requests[requests["session"] >= 0]
    if df.empty:
        return pd.DataFrame(columns=COLUMNS)
    index = df["request"].to_numpy()
    parent = np.full(len(df), -1)
    if cfg.workload.replay == "closed":
        row_of = np.full(len(workload), -1)
        row_of[index] = np.arange(len(df))
        follows = workload.requests.column("follows")[index]
        parent = np.where(follows >= 0, row_of[follows], -1)
    think = workload.requests.column("think_s")[index]
    ideal_end = _ideal_finish(df["arrival_s"].to_numpy(), ideal_service_s(cfg, df), parent, think)
    per = (df.assign(ideal_end=ideal_end)
           .groupby("session", sort=True)
           .agg(requests=("request", "size"), start_s=("arrival_s", "min"),
                end_s=("finish_s", "max"), ideal_end=("ideal_end", "max"))
           .reset_index())
    per["completion_s"] = per["end_s"] - per["start_s"]
    per["ideal_s"] = per["ideal_end"] - per["start_s"]
    per["slowdown"] = per["completion_s"] / per["ideal_s"]
    return per[COLUMNS]


def session_summary(table: pd.DataFrame) -> dict:
    """Task completion and slowdown percentiles; None when there is no session, as in the run
    summary's statistics without a sample."""
    out: dict[str, float | None] = {"sessions": int(len(table))}
    for column, key in (("completion_s", "task_completion_p{}_s"),
                        ("slowdown", "task_slowdown_p{}")):
        for q in PERCENTILES:
            out[key.format(q)] = float(np.percentile(table[column], q)) if len(table) else None
    return out


def ideal_service_s(cfg: Config, requests: pd.DataFrame) -> np.ndarray:
    """Seconds from issue to last token for each request of `requests` served alone on an idle
    deployment, with the prefix hits the run recorded (`hit_tokens` on the prefill side,
    `hit_tokens_decode` on a decode-side cache).

    A hit from a host-tier cache is loaded first; the request's uncached prompt is prefilled in
    chunks, its KV that the decoder lacks crosses the link between them at the link's full line rate
    (plus its one-way latency), then it decodes alone, one token an iteration. With several instance
    groups the best placement counts. In a PDD deployment the relay path's ideal is prefill + RDMA
    to the relay + the whole decode on the relay: its TTFT does not wait for the WAN, and without
    contention a handoff to the main decoder would only add a stall. The direct path to the main
    decoder (P-MD) counts too, as it is faster for a prompt the decoder's cache nearly holds: a
    small delta on the WAN beats the whole prompt on RDMA.
    """
    dep = build(simpy.Environment(), cfg, seed=cfg.seed)
    batching = cfg.batching.under(cfg.engine_profile())
    assert batching.prefill_chunk is not None and batching.token_budget is not None
    step = min(batching.prefill_chunk, batching.token_budget)
    pools = dep.pools
    if "colocated" in pools:
        routes = [(i, i) for i in _distinct(pools["colocated"])]
    else:
        backs = [i for role in ("relay", "decode") for i in _distinct(pools.get(role, []))]
        routes = list(product(_distinct(pools["prefill"]), backs))
    return np.min([_route_s(dep, front, back, step, requests) for front, back in routes], axis=0)


def _distinct(pool: list) -> list:
    """One instance per (cluster, performance model): the others give the same ideal."""
    return list({(i.cluster, id(i.perf)): i for i in pool}.values())


def _route_s(dep: Deployment, front, back, step: int, requests: pd.DataFrame) -> np.ndarray:
    """Service times with the prefill on `front` and the decode on `back` (the same instance when
    colocated: then no KV moves and the decode starts over the prompt alone, while a separate
    decoder also holds the first token's KV, as the pipelines submit it)."""
    inputs = requests["input_tokens"].to_numpy()
    hit = requests["hit_tokens"].to_numpy()
    decode = requests["output_tokens"].to_numpy() - 1     # the prefill's last chunk makes the first
    time = _prefill_s(front.perf, hit, inputs - hit, step)
    if front.host_load is not None:        # a host-tier hit is loaded first, alone on the link
        time += hit * dep.model.kv_bytes_per_token / front.host_load.bandwidth_Bps
    if front is back:
        return time + _decode_s(back.perf, inputs, decode)
    have = requests["hit_tokens_decode"].to_numpy() if back.cache is not None else 0
    # an idle network: a new flow gets the line rate (capped per flow)
    time += dep.expected_transfer_s(front, back, (inputs - have) * dep.model.kv_bytes_per_token)
    return time + _decode_s(back.perf, inputs + 1, decode)


def _prefill_s(perf, context: np.ndarray, todo: np.ndarray, step: int) -> np.ndarray:
    """`todo` prompt tokens over `context` cached ones, in chunks of `step` tokens, one iteration
    each; a chunk attends to the context so far and to itself, as the instance costs it."""
    chunks = ceil_div(todo, step)
    owner = np.repeat(np.arange(len(todo)), chunks)
    done = (np.arange(len(owner)) - (np.cumsum(chunks) - chunks)[owner]) * step
    tokens = np.minimum(step, todo[owner] - done)
    ctx = context[owner] + done
    times = perf.iterations(tokens, chunk_attention_pairs(ctx, tokens), ctx)
    return np.bincount(owner, weights=times, minlength=len(todo))


def _decode_s(perf, context: np.ndarray, k: np.ndarray) -> np.ndarray:
    """k decode iterations of a batch of one starting over `context` KV tokens.

    For a batch of one an iteration's time depends on its context alone, so iteration c of one run
    from an empty context is the first iteration of any run starting over c: each request's decode
    is a difference of two prefix sums of that one run (closed form for the roofline)."""
    run = perf.decode_run(1, 0, max(int((context + k).max()), 1))
    return np.array([run.elapsed(c + n) - run.elapsed(c)
                     for c, n in zip(context.tolist(), k.tolist())])


def _ideal_finish(issue: np.ndarray, service: np.ndarray, parent: np.ndarray,
                  think: np.ndarray) -> np.ndarray:
    """Finish times when each request takes `service` once issued: a root at `issue`, a request
    with a parent (a row position) `think` after the parent's finish. Settled a tree level at a
    time, so sub-agents of one parent run side by side."""
    finish = issue + service
    settled = parent < 0
    pending = np.flatnonzero(~settled)
    while pending.size:
        ready = pending[settled[parent[pending]]]
        if not ready.size:
            raise InputError("workload: 'follows' links form a cycle")
        finish[ready] = finish[parent[ready]] + think[ready] + service[ready]
        settled[ready] = True
        pending = pending[~settled[pending]]
    return finish
