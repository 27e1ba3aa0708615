"""``index/arrays``: NumPy views of Arrow columns without pyarrow's to_numpy (issue 38 part 3)
give what to_numpy gives: the same values and dtype, read-only, sliced and chunked arrays."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from polyindex.index import arrays

TYPES = [pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.uint64(), pa.float16(),
         pa.float32(), pa.float64()]


@pytest.mark.parametrize("typ", TYPES, ids=str)
def test_view_matches_to_numpy(typ):
    base = pa.array(np.arange(40).astype(typ.to_pandas_dtype()), type=typ)
    cases = [base, base.slice(7, 20), base.slice(40), pa.array([], type=typ),
             pa.chunked_array([base.slice(0, 5), base.slice(30, 6)]),
             pa.chunked_array([base.slice(3, 9)]), pa.chunked_array([], type=typ)]
    for arr in cases:
        want = (arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr).to_numpy(
            zero_copy_only=False)
        got = arrays.view(arr)
        assert got.dtype == want.dtype and np.array_equal(got, want)
        assert not got.flags.writeable


def test_nulls_and_other_types_go_to_pyarrow():
    with pytest.raises(pa.ArrowInvalid):  # a copy it was told not to make, as to_numpy
        arrays.view(pa.array([1, None, 3], pa.int32()))
    got = arrays.view(pa.array([1, None, 3], pa.int32()), zero_copy_only=False)
    assert np.isnan(got[1]) and got[2] == 3
    assert arrays.view(pa.array([True, False]), zero_copy_only=False).tolist() == [True, False]


def test_int64_array_takes_rows():
    table = pa.table({"id": ["a", "b", "c", "d"]})
    rows = arrays.int64_array(np.array([3, 0, 2], np.int32))
    assert rows.type == pa.int64()
    assert table.take(rows).column("id").to_pylist() == ["d", "a", "c"]
    assert table.take(arrays.int64_array([])).num_rows == 0
