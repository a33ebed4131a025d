"""What a deployment costs per hour (its GPUs at their prices plus its lines) and what its served
tokens earn at the config's prices, so runs can be ranked by margin as well as by BCR.

Cached input tokens are billed at a fraction of the uncached price (PDD.md 5: 10-25%), so a higher
hit rate saves compute but also earns less: revenue is not monotone in the hit rate."""
from __future__ import annotations

import pandas as pd

from pddsim.config import Config


def gpu_price(cfg: Config, gpu: str) -> float:
    return cfg.gpu_prices.get(gpu, cfg.catalog.gpu(gpu).price_per_hour)


def gpu_count(cfg: Config) -> dict[str, int]:
    counts: dict[str, int] = {}
    for cluster in cfg.clusters.values():
        n = sum(g.count * g.gpus for g in cluster.instances)
        counts[cluster.gpu] = counts.get(cluster.gpu, 0) + n
    return counts


def cost_per_hour(cfg: Config, gpus_held: dict[str, float] | None = None) -> float:
    """The deployment's GPUs (`gpus_held`: those held on average per GPU type, when pools
    scale; else the configured counts) at their prices, plus its lines."""
    held = gpu_count(cfg) if gpus_held is None else gpus_held
    gpus = sum(n * gpu_price(cfg, name) for name, n in held.items())
    lines = sum(c.rdma.price_per_hour for c in cfg.clusters.values())
    if cfg.wan is not None:
        lines += cfg.wan.price_per_hour
    return gpus + lines


def revenue_summary(requests: pd.DataFrame, cfg: Config, duration_s: float,
                    cost_usd_per_hour: float) -> dict:
    """Revenue, cost and margin per hour of the completed requests' tokens: input tokens that hit
    the prefill-side prefix cache at the cached price, the rest at the uncached price, output at
    the output price. Per-1M-token costs spread the hardware cost over the tokens served."""
    p = cfg.pricing
    done = requests[requests["status"] == "completed"]
    cached = float(done["hit_tokens"].sum())
    inputs = float(done["input_tokens"].sum())
    outputs = float(done["tokens_out"].sum())
    hours = max(duration_s, 1e-12) / 3600.0
    revenue = ((inputs - cached) * p.input_usd_per_m + cached * p.cached_input_usd_per_m
               + outputs * p.output_usd_per_m) / 1e6 / hours
    return {
        "revenue_per_hour": revenue,
        "margin_per_hour": revenue - cost_usd_per_hour,
        "cost_per_m_input_tokens": cost_usd_per_hour / (inputs / 1e6 / hours) if inputs else None,
        "cost_per_m_output_tokens": cost_usd_per_hour / (outputs / 1e6 / hours) if outputs else None,
        "cached_input_share": cached / inputs if inputs else None,
    }
