"""Finding a ranker by name: the collection's own artifact first, then the shipped models.

A profile's ``rerank.model`` NAME resolves to the collection artifact ``ranker-NAME`` (written
by ``polyindex train-ranker``); when the collection has none and NAME is a model shipped with
the package (``rerank/models/NAME``, e.g. ``general``), to that. Loaded models are cached per
process keyed by their files (names carry a content hash), so serving never reloads per query
and a retrained model is picked up by the next snapshot.
"""
from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from pathlib import Path

from polyindex.errors import InvalidArgument
from polyindex.rerank.ltr import Ranker

SHIPPED = Path(__file__).resolve().parent / "models"
SHIPPED_FILES = ["ranker.txt", "ranker.json"]
_CACHE: "OrderedDict[tuple, Ranker]" = OrderedDict()
_MAX = 16
_LOCK = threading.Lock()


def artifact_name(name: str) -> str:
    return f"ranker-{name}"


def collection_folder(snapshot) -> Path | None:
    """The collection folder a snapshot belongs to (segments live in <folder>/segments/ or,
    for online buffers, <folder>/buffer/)."""
    folder = getattr(snapshot, "folder", None)
    if folder is not None:
        return Path(folder)
    for seg in snapshot.segments:
        return Path(seg.docs.folder).parent.parent
    return None


@functools.lru_cache(maxsize=1)
def _shipped() -> tuple[str, ...]:
    return tuple(sorted(p.name for p in SHIPPED.iterdir() if (p / SHIPPED_FILES[0]).is_file())
                 if SHIPPED.is_dir() else ())


def shipped_names() -> list[str]:
    """Models shipped with the package (listed once per process: they never change)."""
    return list(_shipped())


def resolve(snapshot, name: str) -> Ranker:
    files = snapshot.manifest.artifacts.get(artifact_name(name))
    folder = collection_folder(snapshot)
    if files and folder is not None:
        where = folder / "artifacts" / artifact_name(name)
        what = f"ranker {name!r} of collection {folder.name!r}"
    elif name in _shipped():
        where, files, what = SHIPPED / name, SHIPPED_FILES, f"shipped ranker {name!r}"
    else:
        raise InvalidArgument(
            f"rerank model {name!r}: the collection has no trained ranker of that name (train "
            f"one with `polyindex train-ranker --name {name}`) and polyindex ships none "
            f"(shipped: {', '.join(shipped_names()) or 'none'})")
    return load(where, list(files), what)


def load(folder: Path, files: list[str], what: str) -> Ranker:
    key = (str(folder), tuple(files))
    with _LOCK:
        ranker = _CACHE.get(key)
        if ranker is not None:
            _CACHE.move_to_end(key)
            return ranker
    ranker = Ranker.load(folder, files, what)
    with _LOCK:
        _CACHE[key] = ranker
        while len(_CACHE) > _MAX:
            _CACHE.popitem(last=False)
    return ranker


def clear_cache() -> None:
    with _LOCK:
        _CACHE.clear()
    _shipped.cache_clear()
