"""Hardware cost of a deployment per hour: its GPUs at their prices plus its lines."""
from __future__ import annotations

from pddsim import catalog
from pddsim.config import Config


def gpu_price(cfg: Config, gpu: str) -> float:
    return cfg.gpu_prices.get(gpu, catalog.gpu(gpu).price_per_hour)


def gpu_count(cfg: Config) -> dict[str, int]:
    counts: dict[str, int] = {}
    for cluster in cfg.clusters.values():
        n = sum(g.count * g.tp for g in cluster.instances)
        counts[cluster.gpu] = counts.get(cluster.gpu, 0) + n
    return counts


def cost_per_hour(cfg: Config) -> float:
    gpus = sum(n * gpu_price(cfg, name) for name, n in gpu_count(cfg).items())
    lines = sum(c.rdma.price_per_hour for c in cfg.clusters.values())
    if cfg.wan is not None:
        lines += cfg.wan.price_per_hour
    return gpus + lines
