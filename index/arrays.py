"""NumPy views of Arrow arrays that do not import pandas.

pyarrow's ``to_numpy`` goes through its pandas conversion, which imports pandas (when it is
installed) at its first call: ~0.17 s of a cold ``polyindex query`` (issue 38). A
fixed-width array without nulls is its data buffer, so ``view`` wraps that buffer itself
(zero-copy, read-only, the same memory ``to_numpy(zero_copy_only=True)`` gives) and leaves
anything else to pyarrow.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

_DTYPES = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32,
           pa.int64(): np.int64, pa.uint8(): np.uint8, pa.uint16(): np.uint16,
           pa.uint32(): np.uint32, pa.uint64(): np.uint64, pa.float16(): np.float16,
           pa.float32(): np.float32, pa.float64(): np.float64}


def view(arr: pa.Array | pa.ChunkedArray, zero_copy_only: bool = True) -> np.ndarray:
    """``arr`` as a NumPy array: a zero-copy view of a fixed-width array without nulls (a
    chunked one combined first), else pyarrow's ``to_numpy(zero_copy_only)`` (which raises
    ``ArrowInvalid`` for a copy it was told not to make, as before)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
    dtype = _DTYPES.get(arr.type)
    if dtype is None or arr.null_count:
        return arr.to_numpy(zero_copy_only=zero_copy_only)
    data = arr.buffers()[1]
    if data is None:  # an empty array may have no buffer
        out = np.zeros(0, dtype)
    else:
        out = np.frombuffer(data, dtype, count=len(arr),
                            offset=arr.offset * np.dtype(dtype).itemsize)
    out.flags.writeable = False  # as pyarrow's view: Arrow data is immutable
    return out


def int64_array(values) -> pa.Array:
    """An Arrow int64 array over ``values`` (row numbers), made from its buffer: ``pa.array``
    of a NumPy array or a list imports pandas too."""
    data = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])
