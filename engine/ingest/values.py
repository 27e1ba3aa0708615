"""Numeric checks every user vector and token matrix passes (finite, bounded, a bounded
dimension), shared by ``vectors`` and ``tokens``."""
from __future__ import annotations

import numpy as np

from polyindex.types import MAX_VECTOR_DIMS

# Past 1e15 a square is 1e30: a 65,536-d inner product or L2 distance could leave float32.
MAX_ABS = 1e15
MAX_DIM = MAX_VECTOR_DIMS


def check_values(arr: np.ndarray, what) -> None:
    """ValueError unless every value is finite and at most ``MAX_ABS`` in magnitude;
    ``what(index)`` names the first bad position (an index tuple) in the message."""
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        at = tuple(int(i[0]) for i in np.nonzero(~np.isfinite(arr)))
        raise ValueError(f"{what(at)} is {arr[at]} (NaN and infinity are refused)")
    big = np.abs(arr) > MAX_ABS
    if big.any():
        at = tuple(int(i[0]) for i in np.nonzero(big))
        raise ValueError(f"{what(at)} is {float(arr[at]):g}, over the limit of {MAX_ABS:g} "
                         "in magnitude")
