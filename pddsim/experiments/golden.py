"""Pinned figures: a golden file names scenarios and the summary values they must reproduce within
stated tolerances, so a CI pipeline fails when a change moves them.

    scenarios:
      - config: ../configs/paper/pdd.yaml        # relative to the golden file
        set: [workload.horizon_s=150]
        seed: 0
        pins:
          ttft_p50_s: {value: 0.40, rel: 0.05}   # relative tolerance
          rld_token_share: {value: 0.06, abs: 0.01}
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml
from pydantic import Field, model_validator

from pddsim.config import load_config
from pddsim.errors import InputError
from pddsim.schema import Strict, load_model
from pddsim.sim import load_workload, simulate


class Pin(Strict):
    value: float | None
    rel: float | None = Field(None, ge=0)
    abs: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _one_tolerance(self):
        if (self.rel is None) == (self.abs is None):
            raise ValueError("give exactly one of rel and abs")
        return self

    def holds(self, got) -> bool:
        if self.value is None or got is None:
            return self.value is None and got is None
        slack = self.abs if self.abs is not None else (self.rel or 0.0) * abs(self.value)
        return abs(got - self.value) <= slack


class Scenario(Strict):
    config: str
    set: list[str] = []
    seed: int | None = None
    pins: dict[str, Pin] = Field(min_length=1)


class Golden(Strict):
    scenarios: list[Scenario] = Field(min_length=1)


def check_golden(path: Path, *, update: bool = False) -> list[dict]:
    """Re-run every scenario; one row per pinned figure with what it is now and whether it holds.
    With `update`, rewrite the file with the values of now (tolerances kept): for re-pinning after
    an intended change."""
    golden = load_model(Golden, path, "golden file")
    rows = []
    for sc in golden.scenarios:
        cfg = load_config(path.parent / sc.config, sc.set)
        summary = simulate(cfg, load_workload(cfg), sc.seed).summary
        for key, pin in sc.pins.items():
            if key not in summary:
                raise InputError(f"{path}: {cfg.name}: no summary key {key!r}")
            got = summary[key]
            rows.append({"scenario": cfg.name, "key": key, "pinned": pin.value, "got": got,
                         "tolerance": f"±{pin.abs:g}" if pin.abs is not None else f"±{pin.rel:.0%}",
                         "ok": pin.holds(got)})
            pin.value = got
    if update:
        path.write_text(HEADER + yaml.safe_dump(golden.model_dump(exclude_none=True), sort_keys=False))
    return rows


HEADER = "# Pinned figures; re-pin after an intended change with `pddsim check FILE --update`.\n"


def format_rows(rows: list[dict]) -> str:
    """One line per pinned figure, grouped by scenario: pinned, now, tolerance, ok or MOVED."""
    def show(v):
        return "None" if v is None else f"{v:.6g}"
    frame = pd.DataFrame({
        "pinned": [show(r["pinned"]) for r in rows], "now": [show(r["got"]) for r in rows],
        "tolerance": [r["tolerance"] for r in rows],
        "status": ["ok" if r["ok"] else "MOVED" for r in rows],
    }, index=pd.MultiIndex.from_tuples([(r["scenario"], r["key"]) for r in rows]))
    return frame.to_string()
