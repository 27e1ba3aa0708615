"""Standard vector files as document sources: .npy, .fvecs, .bvecs, ANN-benchmarks HDF5.

Each row becomes a document with only an id and its vector (the unnamed field ``dense``).
Ids come from an id file (one per line, ``ids=``) or are the row numbers ``0..n-1``, which
is what ANN-benchmarks' ``neighbors`` refer to. Files are memory-mapped and checked a block
at a time (NaN, infinity, magnitude), so a bad row is named by its row number without a
Python object per value. HDF5 needs the optional ``h5py`` (``pip install h5py``, the extra ``hdf5``);
its ``train`` dataset is indexed, ``test`` and ``neighbors`` are what bench_ann reads.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from polyindex.errors import InputError, InvalidArgument, install_hint
from polyindex.ingest.values import MAX_ABS
from polyindex.types import Document

VECTOR_FORMATS = {".npy": "npy", ".fvecs": "fvecs", ".bvecs": "bvecs", ".hdf5": "hdf5",
                  ".h5": "hdf5"}
BLOCK = 8192


def _xvecs(path: Path, source: str, dtype) -> np.ndarray:
    """(n, d) view of an .fvecs (int32 d, then d float32) or .bvecs (int32 d, d uint8) file."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    if raw.size < 4:
        raise InputError("empty or truncated vector file", source=source)
    d = int(raw[:4].view(np.int32)[0])
    width = 4 + d * np.dtype(dtype).itemsize
    if d <= 0 or raw.size % width:
        raise InputError(f"not a {path.suffix} file: first dimension {d} does not divide its "
                         f"{raw.size} bytes into whole records", source=source)
    rows = raw.reshape(-1, width)
    dims = rows[:, :4].copy().view(np.int32).ravel()
    if (dims != d).any():
        bad = int(np.flatnonzero(dims != d)[0])
        raise InputError(f"record has dimension {int(dims[bad])}, the file's first has {d}",
                         source=source, line=bad + 1)
    return rows[:, 4:].view(dtype)


def load_matrix(path: Path, source: str, dataset: str = "train") -> np.ndarray:
    """The file's (n, d) vectors, memory-mapped where the format allows."""
    fmt = VECTOR_FORMATS.get(path.suffix.lower())
    if fmt == "npy":
        try:
            m = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as e:
            raise InputError(f"not a readable .npy file: {e}", source=source) from e
    elif fmt == "fvecs":
        m = _xvecs(path, source, np.float32)
    elif fmt == "bvecs":
        m = _xvecs(path, source, np.uint8)
    elif fmt == "hdf5":
        try:
            import h5py
        except ImportError:
            raise InvalidArgument(f"{source}: reading HDF5 needs h5py: "
                                  f"{install_hint('hdf5', 'h5py')}") from None
        with h5py.File(path, "r") as f:
            if dataset not in f:
                raise InputError(f"HDF5 file has no {dataset!r} dataset (has: "
                                 f"{', '.join(f.keys())})", source=source, field=dataset)
            m = f[dataset][...]  # ANN-benchmarks files are read whole (h5py cannot memory-map)
    else:
        raise InvalidArgument(f"{source}: not a vector file")
    if m.ndim != 2 or m.dtype.kind not in "iuf":
        raise InputError(f"expected a 2-D array of numbers, got shape {m.shape}, dtype {m.dtype}",
                         source=source)
    return m


# ANN-benchmarks' ``distance`` attribute -> the dense metric that ranks the same way
FILE_METRICS = {"angular": "cosine", "euclidean": "l2"}


def file_metric(path: Path) -> tuple[str | None, str | None]:
    """(the distance an ANN-benchmarks HDF5 file is marked with, the dense metric that ranks
    by it); (None, None) for other formats, unmarked files, or without h5py."""
    if VECTOR_FORMATS.get(Path(path).suffix.lower()) != "hdf5":
        return None, None
    try:
        import h5py
    except ImportError:
        return None, None  # reading the file says how to install it
    try:
        with h5py.File(path, "r") as f:
            distance = f.attrs.get("distance")
    except OSError:
        return None, None  # not readable: reading it names the problem
    if isinstance(distance, bytes):
        distance = distance.decode("utf-8", "replace")
    distance = str(distance).lower() if distance is not None else None
    return distance, FILE_METRICS.get(distance)


def read_ids(path: Path | None, n: int) -> list[str] | None:
    if path is None:
        return None
    ids = [line.rstrip("\n\r") for line in Path(path).read_text(encoding="utf-8").splitlines()]
    ids = [i for i in ids if i]
    if len(ids) != n:
        raise InputError(f"the id file has {len(ids)} ids, the vector file {n} rows",
                         source=str(path))
    return ids


def vector_file_records(path: Path, source: str, start: int, vectors=None,
                        ids_path: Path | None = None) -> Iterator[tuple[int, Document | InputError]]:
    m = load_matrix(path, source)
    ids = read_ids(ids_path, len(m))
    for lo in range(start, len(m), BLOCK):
        block = np.asarray(m[lo:lo + BLOCK], dtype=np.float32)
        bad = ~np.isfinite(block).all(1) | (np.abs(np.nan_to_num(block, nan=0.0)).max(1) > MAX_ABS)
        for j in range(len(block)):
            row = lo + j
            doc_id = ids[row] if ids is not None else str(row)
            if bad[j]:
                col = int(np.flatnonzero(~np.isfinite(block[j]) | (np.abs(block[j]) > MAX_ABS))[0])
                yield row, InputError(f"vector component {col} is {block[j, col]:g} (NaN, "
                                      f"infinity and magnitudes over {MAX_ABS:g} are refused)",
                                      source=source, line=row + 1, field="vector", doc_id=doc_id)
                continue
            doc = Document(doc_id, "", "", {}, {"dense": block[j]})
            err = vectors.check(doc.vectors, source=source, line=row + 1, doc_id=doc_id) \
                if vectors is not None else None
            yield row, err if err is not None else doc


def count_rows(path: Path, source: str) -> int:
    return len(load_matrix(path, source))
