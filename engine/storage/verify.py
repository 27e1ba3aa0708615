"""A full check of stored collections (``polyindex verify``): every file every manifest names.

Unlike opening a collection, which stops at the first bad file and trusts files it checked
earlier in the process, this reads every file again and reports every problem: the
manifest (its checksum, structure and paths), each segment's files (size, xxh3, and Arrow
validation of the Arrow IPC files; format-1 entries without sums: Arrow validation only),
tombstone files (also their row ids against the segment and the manifest's deleted count)
and collection artifacts. The write-ahead log is checked by the ``wal`` function the caller
passes (``online.wal_check.check_wal``: the log's format is the online room's); without one
its files are only listed with their sizes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from polyindex.config import validate_name
from polyindex.errors import Corrupt, NotFound
from polyindex.storage import encoders
from polyindex.storage.integrity import check_file, remember, validate_arrow
from polyindex.storage.manifest import MANIFEST, read_manifest
from polyindex.storage.segment import DOCS_FILE, load_tombstones

WAL_DIR = "wal"


@dataclass
class CollectionReport:
    name: str
    folder: Path
    format_version: int | None = None
    checked: int = 0         # files read and checked in full
    bytes: int = 0           # bytes read to check them
    unchecked: list[str] = field(default_factory=list)  # format-1 files with nothing to check
    problems: list[dict] = field(default_factory=list)  # {"file", "problem"}
    # {"file", "size"} (+ "unsealed_records", "torn_tail_at" when checked)
    wal: list[dict] = field(default_factory=list)
    wal_checked: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def bad(self, path: Path, problem: str) -> None:
        prefix = f"{path}: "
        self.problems.append({"file": str(path), "problem": problem.removeprefix(prefix)})

    def to_json(self) -> dict:
        return {"collection": self.name, "folder": str(self.folder), "ok": self.ok,
                "format_version": self.format_version, "files_checked": self.checked,
                "bytes_checked": self.bytes, "unchecked": self.unchecked,
                "problems": self.problems, "wal": self.wal, "wal_checked": self.wal_checked}


# (wal folder, the manifest's wal_through) -> (entries, problems as (file, why))
WalCheck = Callable[[Path, int], "tuple[list[dict], list[tuple[Path, str]]]"]


def verify_data(data: Path, collection: str | None = None,
                wal: WalCheck | None = None) -> list[CollectionReport]:
    """Check one collection of a data directory, or every collection in it."""
    data = Path(data)
    if not data.is_dir():
        raise NotFound(f"data directory {data} does not exist")
    if collection is not None:
        folder = data / validate_name(collection)
        if not folder.is_dir():
            raise NotFound(f"collection {collection!r} not found in {data}")
        return [verify_collection(folder, wal)]
    # Dot-folders are leftovers of an interrupted create or drop, never collections.
    return [verify_collection(p, wal) for p in sorted(data.iterdir())
            if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST).exists()]


def verify_collection(folder: Path, wal: WalCheck | None = None) -> CollectionReport:
    report = CollectionReport(folder.name, folder)
    try:
        manifest = read_manifest(folder)
    except FileNotFoundError:
        report.bad(folder / MANIFEST, "missing")
        _wal(report, wal, 0)
        return report
    except Corrupt as e:
        report.bad(folder / MANIFEST, str(e))
        _wal(report, wal, 0)
        return report
    report.format_version = manifest.format_version
    report.checked += 1
    report.bytes += (folder / MANIFEST).stat().st_size
    for entry in manifest.segments:
        _segment(report, folder / "segments" / entry.id, entry)
        if entry.tombstones:
            _tombstones(report, folder, entry)
    for kind, files in manifest.artifacts.items():
        sums = manifest.artifact_sums.get(kind, {})
        for name in files:
            _file(report, folder / "artifacts" / kind / name, sums.get(name))
    for rel, expect in encoders.files_of(manifest).items():
        _file(report, folder / rel, expect)
    _wal(report, wal, manifest.wal_through)
    return report


def _file(report: CollectionReport, path: Path, expect: dict | None) -> int | None:
    """Check one file (sum, then Arrow validation of an Arrow file); its rows if Arrow."""
    try:
        if expect is not None:
            report.bytes += check_file(path, expect, cached=False)
        elif not path.suffix == ".arrow":
            if not path.is_file():
                raise Corrupt(f"{path}: missing (the manifest names it)")
            report.unchecked.append(str(path))
            return None
        rows = validate_arrow(path) if path.suffix == ".arrow" else None
        if expect is None:
            report.bytes += path.stat().st_size
    except Corrupt as e:
        report.bad(path, str(e))
        return None
    report.checked += 1
    return rows


def _segment(report: CollectionReport, seg: Path, entry) -> None:
    if not seg.is_dir():
        report.bad(seg, f"segment {entry.id}: folder is missing (the manifest names it)")
        return
    present = sorted(p.name for p in seg.iterdir())
    if entry.files is not None:
        for name in present:
            if name not in entry.files:
                report.bad(seg / name, f"segment {entry.id}: a file its manifest entry does "
                           "not list")
        names = list(entry.files)
    else:  # format 1: whatever is there (Arrow files validated, others only listed)
        names = present if DOCS_FILE in present else [DOCS_FILE, *present]
    for name in names:
        expect = entry.files.get(name) if entry.files is not None else None
        rows = _file(report, seg / name, expect)
        if name == DOCS_FILE and rows is not None and rows != entry.n_rows:
            report.bad(seg / name, f"{rows} rows, the manifest says {entry.n_rows}")


def _tombstones(report: CollectionReport, folder: Path, entry) -> None:
    path = folder / entry.tombstones
    try:
        if entry.tombstones_sum is not None:
            report.bytes += check_file(path, entry.tombstones_sum, cached=False)
            remember(path, entry.tombstones_sum)  # read once: load_tombstones trusts it now
        else:
            report.bytes += path.stat().st_size if path.exists() else 0
        load_tombstones(folder, entry)  # format 1: Arrow validation; then the row ids
    except Corrupt as e:
        report.bad(path, str(e))
        return
    report.checked += 1


def _wal(report: CollectionReport, check: WalCheck | None, after: int) -> None:
    folder = report.folder / WAL_DIR
    if check is None:
        if folder.is_dir():
            report.wal = [{"file": str(p), "size": p.stat().st_size}
                          for p in sorted(folder.iterdir()) if p.is_file()]
        return
    report.wal, problems = check(folder, after)
    report.wal_checked = True
    for path, why in problems:
        report.bad(path, why)
    report.checked += len(report.wal) - len(problems)
    report.bytes += sum(w["size"] for w in report.wal)
