"""An ANN-benchmarks ``.hdf5`` file marked ``distance=angular`` (or ``euclidean``) indexed by
the metric that ranks as it says.

A new collection's unnamed dense index given without a ``metric=`` gets the file's (angular:
``metric=cosine``; the default ``ip`` over unnormalized vectors would rank by something
else), and the command says so; an existing collection whose metric differs is warned about
(its metric is fixed by its stored indexes).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from polyindex.ingest.vector_files import file_metric


def _unnamed_dense(factory: str) -> bool:
    kind, _, _ = factory.partition(":")
    return kind.strip() == "dense"


def _options(factory: str) -> list[str]:
    return [o.strip() for o in factory.partition(":")[2].split(",") if o.strip()]


def indexes_for_new(src: Path, indexes: Sequence[str], say: Callable[[str], None]) -> list[str]:
    """``indexes`` with the file's metric put into an unnamed dense index that names none."""
    distance, metric = file_metric(src)
    if metric is None:
        return list(indexes)
    out = []
    for f in indexes:
        if _unnamed_dense(f) and not any(o.startswith("metric=") for o in _options(f)):
            opts = [f"metric={metric}", *_options(f)]
            out.append("dense:" + ",".join(opts))
            say(f"{src.name} is marked distance={distance}: indexing its vectors with "
                f"{out[-1]!r} (give --index dense:metric=... to choose)")
        else:
            out.append(f)
    return out


def check_existing(src: Path, collection, say: Callable[[str], None]) -> None:
    """Warn when the file's distance is not the metric of the collection's unnamed field."""
    distance, metric = file_metric(src)
    kind = collection.kinds.get("dense") if metric is not None else None
    if kind is not None and getattr(kind, "metric", metric) != metric:
        say(f"warning: {src.name} is marked distance={distance}, but collection "
            f"{collection.name!r} ranks its vectors by metric={kind.metric} (metric="
            f"{metric} ranks as the file means; a collection's metric is fixed when it is "
            "created)")
