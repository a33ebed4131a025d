"""Integer arithmetic every layer needs: how many whole blocks (KV pages, hash blocks, prefill
chunks) hold a number of tokens."""
from __future__ import annotations

from typing import Any, overload

import numpy as np


@overload
def ceil_div(n: int, d: int) -> int: ...
@overload
def ceil_div(n: np.ndarray, d: int) -> np.ndarray: ...
def ceil_div(n: Any, d: int) -> Any:
    """ceil(n / d) in exact integer arithmetic (scalars or integer arrays)."""
    return -(-n // d)
