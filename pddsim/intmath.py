"""Integer arithmetic every layer needs: how many whole blocks (KV pages, hash blocks, prefill
chunks) hold a number of tokens."""
from __future__ import annotations

from typing import TypeVar

import numpy as np

N = TypeVar("N", int, np.ndarray)


def ceil_div(n: N, d: int) -> N:
    """ceil(n / d) in exact integer arithmetic (scalars or integer arrays)."""
    return -(-n // d)
