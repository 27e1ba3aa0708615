"""A collection's adapted encoders (``polyindex adapt``): versioned, checksummed folders
``encoders/<name>/`` (a sentence-transformers model folder), named by the manifest.

The manifest's ``encoder`` record says which encoder made every stored vector:
``{"current": REC or null, "previous": REC or null}`` where REC is ``{"name": "v2", "files":
{relative path: {size, xxh3}}}`` and null means the collection's base model
(``config.model``). No record at all: never adapted (the base model). ``previous`` is what
``adapt --revert`` goes back to; a revert swaps the two, so a second revert returns.

An encoder folder is written under ``encoders/.<name>.tmp``, every file and folder fsynced,
renamed to ``encoders/<name>``, and ``encoders/`` fsynced before a manifest names it. Its
files are checked (size and xxh3: ``integrity.check_file``, once per process per file)
whenever a manifest naming it is loaded, so a damaged weight file is ``Corrupt`` naming the
file before a model reads a byte. Folders neither record names are removed after a commit
(``remove_unnamed``); a crash's temporary folder too.
"""
from __future__ import annotations

import json
from pathlib import Path

import xxhash

from polyindex.errors import Corrupt
from polyindex.storage.fsutil import fsync_dir, fsync_file, rename, rmtree
from polyindex.storage.integrity import check_file, check_sum_entry, is_plain_name, remember, sum_file

FOLDER = "encoders"
POINT = "adapt.encoder"


def current(manifest) -> dict | None:
    """The record of the encoder the stored vectors were made with (None: the base model)."""
    return (manifest.encoder or {}).get("current")


def previous(manifest) -> dict | None:
    return (manifest.encoder or {}).get("previous")


def fingerprint(rec: dict | None) -> str | None:
    """One sum over an encoder's file listing: what a loaded model is keyed by, so two
    collections (or a collection dropped and made again) never share a stale model."""
    if rec is None:
        return None
    canon = json.dumps(rec["files"], sort_keys=True, separators=(",", ":"))
    return xxhash.xxh3_64_hexdigest(canon.encode())


def model_of(folder: Path, manifest) -> tuple[str, str | None]:
    """(model path or name, fingerprint or None) that encodes for ``manifest``."""
    rec = current(manifest)
    if rec is None:
        return manifest.config.model, None
    return str(folder / FOLDER / rec["name"]), fingerprint(rec)


def check_record(value: object) -> None:
    """The manifest's ``encoder`` value, structurally (Corrupt naming what is wrong)."""
    if value is None:
        return
    if not isinstance(value, dict) or set(value) - {"current", "previous"}:
        raise Corrupt(f"encoder record {value!r} is not {{current, previous}}")
    for key in ("current", "previous"):
        rec = value.get(key)
        if rec is None:
            continue
        if not isinstance(rec, dict) or not is_plain_name(rec.get("name")) \
                or not isinstance(rec.get("files"), dict) or not rec["files"]:
            raise Corrupt(f"encoder {key}: malformed record {rec!r}")
        for rel, expect in rec["files"].items():
            if not isinstance(rel, str) or not all(is_plain_name(p) for p in rel.split("/")):
                raise Corrupt(f"encoder {rec['name']}: file {rel!r} is not a plain relative path")
            check_sum_entry(expect, f"encoder {rec['name']} file {rel}")


def check_files(folder: Path, manifest) -> None:
    """Every file of the encoders the manifest names (current and previous)."""
    for rec in (current(manifest), previous(manifest)):
        if rec is not None:
            base = folder / FOLDER / rec["name"]
            for rel, expect in rec["files"].items():
                check_file(base / rel, expect)


def files_of(manifest) -> dict[str, dict]:
    """Relative to the collection: every encoder file the manifest names, with its sum."""
    out = {}
    for rec in (current(manifest), previous(manifest)):
        if rec is not None:
            out.update({f"{FOLDER}/{rec['name']}/{rel}": v for rel, v in rec["files"].items()})
    return out


def next_name(folder: Path, manifest) -> str:
    """``vN`` above every name the manifest or the folder has used."""
    used = [r["name"] for r in (current(manifest), previous(manifest)) if r]
    root = folder / FOLDER
    if root.is_dir():
        used += [p.name.lstrip(".").split(".")[0] for p in root.iterdir()]
    nums = [int(n[1:]) for n in used if n.startswith("v") and n[1:].isdigit()]
    return f"v{max(nums, default=1) + 1}"


def install(folder: Path, source: Path, name: str) -> dict:
    """Make the model folder ``source`` (plain writes, e.g. the learner's output, already
    placed at ``encoders/.<name>.tmp``) the durable encoder ``name``: every file and folder
    fsynced, summed, renamed into place, ``encoders/`` fsynced. Returns its record."""
    root = folder / FOLDER
    files = {}
    dirs = [source]
    for path in sorted(source.rglob("*")):
        if path.is_symlink():
            raise Corrupt(f"{path}: an encoder folder may not hold links")
        if path.is_dir():
            dirs.append(path)
        elif path.is_file():
            fsync_file(path, POINT)
            files[path.relative_to(source).as_posix()] = sum_file(path)
    for d in sorted(dirs, key=lambda p: -len(p.parts)):
        fsync_dir(d, POINT)
    final = root / name
    rmtree(final, POINT)  # a crashed earlier try of the same name: never named by a manifest
    rename(source, final, POINT)
    fsync_dir(root, POINT)
    for rel, expect in files.items():
        remember(final / rel, expect)
    return {"name": name, "files": files}


def tmp_folder(folder: Path, name: str) -> Path:
    root = folder / FOLDER
    root.mkdir(exist_ok=True)
    return root / f".{name}.tmp"


def remove_unnamed(folder: Path, manifest, keep: set[str] = frozenset()) -> list[str]:
    """Remove encoder folders ``manifest`` does not name (and ``keep`` does not list): an
    older adapt's, a crash's. Returns the names removed."""
    root = folder / FOLDER
    named = {r["name"] for r in (current(manifest), previous(manifest)) if r} | set(keep)
    gone = []
    for p in sorted(root.iterdir()) if root.is_dir() else ():
        if p.name not in named:
            rmtree(p, "adapt.gc")
            gone.append(p.name)
    if gone:
        fsync_dir(root, "adapt.gc")
    return gone
