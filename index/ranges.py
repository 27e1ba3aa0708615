"""Row ranges of CSR-like layouts (a row's tokens or terms are ``[starts[i], ends[i])``)."""
from __future__ import annotations

import numpy as np


def concat_ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The indices of every range ``[starts[i], ends[i])``, concatenated in order."""
    lengths = (ends - starts).astype(np.int64)
    if not len(lengths) or not lengths.sum():
        return np.zeros(0, np.int64)
    shift = np.repeat(starts.astype(np.int64) - np.concatenate([[0], np.cumsum(lengths)[:-1]]),
                      lengths)
    return np.arange(int(lengths.sum()), dtype=np.int64) + shift
