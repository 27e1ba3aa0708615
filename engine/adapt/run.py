"""``polyindex adapt`` as an operation of a collection: learn an encoder from the collection
(``adapt.learn``), make it a durable artifact (``storage.encoders``), re-encode every segment
with it (``storage.reencode``) and commit segments and encoder in one manifest version;
``revert=True`` re-encodes with the previous encoder and commits that instead.

The guard: the default learner holds back a share of its synthetic queries and reports
whether the student beats the current encoder on them (``adapt.guard``); when it does not,
the student is deleted before it is installed and the collection is left exactly as it was
(the report's ``committed`` is False, ``refused`` says why).

Phases and what a crash (kill -9) at each leaves: learning writes only
``encoders/.vN.tmp`` (removed by the next adapt); the installed encoder and the rebuilt
segments under ``adapt/`` are named by no manifest (the collection answers as before; a
rerun resumes: the encoder from ``adapt/state.json``, every segment already rebuilt); the
commit is one manifest rename (before it: as before; after it: the adapted collection).

Writes meanwhile: learning and re-encoding run from a snapshot without a lock. The commit
holds the writer (and, for an online collection, its buffer's lock, after sealing the buffer)
and re-encodes the segments that arrived since the snapshot, so writes wait only for that
delta; deletes meanwhile are kept (tombstones carry over row for row).
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from polyindex.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from polyindex.storage import encoders, failpoints, reencode
from polyindex.storage.fsutil import rmtree, write_json_atomic
from polyindex.types import document_text

STATE = "state.json"
_REFUSED = object()  # _learned's answer when the guard refused the student
TEACHER_BATCH = 256
_running: set[str] = set()
_running_lock = threading.Lock()


def check_adaptable(coll) -> None:
    """The refusals, before any work: a read-only handle, a collection without a text model
    or without an index the model feeds."""
    if coll.readonly:
        raise FailedPrecondition(f"collection {coll.name!r} is open read-only: adapt rewrites "
                                 "its vectors; open it for writing")
    if coll.config.model is None:
        raise FailedPrecondition(
            f"collection {coll.name!r} has no text model (vectors only, --model none): adapt "
            "learns a text encoder and re-encodes stored texts; there is none to adapt")
    if not coll.encoding.encodes_text():
        raise FailedPrecondition(
            f"collection {coll.name!r} has no index its model feeds (its indexes: "
            f"{', '.join(coll.kinds)}): adapt changes the text model's vectors; index with "
            "dense (or multivector, sparse, tree) to use it")


def corpus(snap) -> tuple[list[str], list[str], list[str | None]]:
    """(ids, texts, titles) of the live, unpruned documents of a snapshot, in its order
    (a text: title and body as the model reads them, ``types.document_text``)."""
    ids, texts, titles = [], [], []
    for seg, live in zip(snap.segments, snap.live):
        t = seg.docs.table
        pruned = seg.docs.pruned()
        for r, (i, title, text) in enumerate(zip(t.column("id").to_pylist(),
                                                 t.column("title").to_pylist(),
                                                 t.column("text").to_pylist())):
            if (live is None or live[r]) and (pruned is None or not pruned[r]):
                ids.append(i)
                texts.append(document_text(title, text))
                titles.append(title or None)
    return ids, texts, titles


def teacher_of(coll, ids: list[str], profile=None):
    """``teacher(queries, depth)``: per query, row numbers into ``ids`` best first, by the
    collection's default text profile (its current best, e.g. hybrid)."""
    row = {d: i for i, d in enumerate(ids)}

    def teacher(queries, depth: int) -> list[list[int]]:
        out = []
        for start in range(0, len(queries), TEACHER_BATCH):
            hits = coll.query_batch(list(queries[start:start + TEACHER_BATCH]),
                                    k=max(1, min(int(depth), 1000)), profile=profile)
            out += [[row[h.id] for h in hs if h.id in row] for hs in hits]
        return out
    return teacher


def recipe_of(value):
    """The learner's recipe from None, a ``Recipe`` or a dict of its fields (the CLI's
    ``--recipe``, the RPC's map: JSON values), checked."""
    if value is None or not isinstance(value, dict):
        return value
    from polyindex.adapt.recipe import Recipe
    values = {}
    for key, v in value.items():
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except ValueError:
                pass
        values[key] = v
    try:
        return Recipe(**values)
    except TypeError as e:
        raise InvalidArgument(f"recipe: {e}") from None


def _encode_with(coll, current, device: str):
    """A writer's ``encode(texts, on_batch)`` for the encoder ``current`` (model, fp)."""
    from polyindex.ingest.encoding import Encoding
    enc = Encoding(coll.name, coll.config.model, coll.config.dtype, device, coll.kinds)
    enc.follow(current)
    return enc.document_encoder()


def adapt(coll, *, revert: bool = False, device: str | None = None, recipe=None,
          progress=None, learner=None, seed: int = 0, ray: dict | None = None) -> dict:
    """Adapt (or revert) ``coll``'s encoder; see the module. ``progress(phase, done, total)``;
    ``learner``: ``adapt.learn.learn``'s signature (the default); ``ray``: re-encode on Ray
    encoder actors (``{"encoders": N, "address": ADDR or None}``: ``distributed.reencode``)."""
    check_adaptable(coll)
    recipe = recipe_of(recipe)
    key = str(Path(coll.folder).resolve())
    with _running_lock:
        if key in _running:
            raise ResourceExhausted(f"collection {coll.name!r}: an adapt is already running")
        _running.add(key)
    try:
        return _adapt(coll, revert, device or coll.device, recipe, progress, learner, seed,
                      ray)
    finally:
        with _running_lock:
            _running.discard(key)


def _adapt(coll, revert, device, recipe, progress, learner, seed, ray) -> dict:
    folder = Path(coll.folder)
    table = coll.table
    t0 = time.perf_counter()
    snap = coll.live.sealed_through_now()  # online: every acknowledged write sealed first
    m = snap.manifest
    cur, prev = encoders.current(m), encoders.previous(m)
    report = {"collection": coll.name, "reverted": revert, "learn": None}
    if revert:
        if m.encoder is None or (cur is None and prev is None):
            raise FailedPrecondition(f"collection {coll.name!r} was never adapted: nothing to "
                                     "revert")
        target = prev
        # an interrupted adapt's leftovers (its encoder, its rebuilds) are given up
        for p in sorted((folder / reencode.WORK).glob("*")):
            if p.name != _work_name(prev, True):
                rmtree(p, "adapt.gc")
        encoders.remove_unnamed(folder, m)
    else:
        target = _learned(coll, snap, device, recipe, progress, learner, seed, report)
        if target is _REFUSED:  # the guard: nothing installed, nothing written
            return _refused(coll, m, cur, prev, report, t0)
    t_learn = time.perf_counter()
    target_model = (encoders.model_of(folder, _with(m, target)))
    encode = _encode_with(coll, target_model, device)
    work = reencode.work_dir(folder, _work_name(target, revert))
    spec = coll.encoding.vector_spec().fields
    step = None if progress is None else (lambda d, n: progress("re-encoding", d, n))
    if ray is not None:
        from polyindex.distributed.reencode import rebuild_on_ray
        report["reencoded_rows"] = rebuild_on_ray(
            folder, snap, work, target_model, encoders=ray.get("encoders", 1),
            address=ray.get("address"), device=device, progress=step)
    else:
        report["reencoded_rows"] = reencode.rebuild_snapshot(folder, snap, work, coll.kinds,
                                                             spec, encode, step)
    del snap
    failpoints.hit("adapt.commit.before")
    record = {"current": target, "previous": cur}
    report.update(_commit(coll, work, spec, encode, record))
    failpoints.hit("adapt.commit.after")
    new = table.sealed_snapshot().manifest
    encoders.remove_unnamed(folder, new)
    reencode.discard(folder)
    report.update(committed=True, refused=None,
                  encoder=target["name"] if target else "base",
                  previous=cur["name"] if cur else "base", documents=new.live_rows(),
                  seconds={"learn": round(t_learn - t0, 3),
                           "reencode_and_commit": round(time.perf_counter() - t_learn, 3)})
    return report


def _refused(coll, m, cur, prev, report, t0) -> dict:
    """The report of an adapt the guard refused: the collection is as it was."""
    report.update(committed=False, refused=report["learn"]["guard"]["reason"],
                  encoder=cur["name"] if cur else "base",
                  previous=prev["name"] if prev else "base", documents=m.live_rows(),
                  reencoded_rows=0, delta_rows=0,
                  seconds={"learn": round(time.perf_counter() - t0, 3),
                           "reencode_and_commit": 0.0})
    return report


def _work_name(target: dict | None, revert: bool) -> str:
    """The work folder of re-encoding with ``target``: its name and fingerprint."""
    return ("revert-" if revert else "") + (
        f"{target['name']}-{encoders.fingerprint(target)}" if target else "base")


def _with(m, rec):
    out = m.copy()
    out.encoder = {"current": rec, "previous": None}
    return out


def _learned(coll, snap, device, recipe, progress, learner, seed, report):
    """The new encoder's record: learned now (and installed), or the one an interrupted
    adapt of this manifest's encoder installed (``adapt/state.json``); ``_REFUSED`` when the
    learner's guard (``adapt.guard``) says the student is not better than the current
    encoder. A learner that reports no guard (a caller's own) is trusted."""
    folder = Path(coll.folder)
    m = snap.manifest
    base = encoders.current(m)
    state_path = folder / reencode.WORK / STATE
    state = _read_state(state_path)
    if state is not None and state.get("from") == encoders.fingerprint(base):
        rec = state["record"]
        try:
            encoders.check_files(folder, _with(m, rec))
            report["learn"] = {"resumed": rec["name"]}
            return rec
        except Exception:  # damaged or gone: learned again
            pass
    reencode.discard(folder)  # another operation's leftovers
    encoders.remove_unnamed(folder, m)
    ids, texts, titles = corpus(snap)
    if not any(t.strip() for t in texts):
        raise FailedPrecondition(f"collection {coll.name!r} stores no text to learn from")
    if learner is None:
        learner = _default_learner()
    from polyindex.encode.text import resolve_model
    name = encoders.next_name(folder, m)
    out = encoders.tmp_folder(folder, name)
    failpoints.hit("adapt.learn.before", out)
    base_model = resolve_model(encoders.model_of(folder, m)[0])
    step = None if progress is None else \
        (lambda phase, done, total: progress(f"learning: {phase}", done, total))
    lexical = teacher_of(coll, ids, "lexical") if {"lexical", "dense"} <= set(coll.kinds) \
        else None  # the guard then scores hybrid, as the collection serves it
    report["learn"] = learner(texts, teacher_of(coll, ids), base_model, out, recipe=recipe,
                              progress=step, device=device, seed=seed, titles=titles,
                              lexical=lexical)
    verdict = (report["learn"] or {}).get("guard")
    if verdict is not None and not verdict.get("passed"):
        rmtree(out, "adapt.refused")  # the student is not better: never installed
        try:
            out.parent.rmdir()  # encoders/ made for it alone (never adapted): gone too
        except OSError:
            pass
        return _REFUSED
    rec = encoders.install(folder, out, name)
    state_path.parent.mkdir(exist_ok=True)
    write_json_atomic(state_path, {"from": encoders.fingerprint(base), "record": rec},
                      "adapt.state")
    return rec


def _default_learner():
    from polyindex.adapt.learn import learn
    return learn


def _read_state(path: Path) -> dict | None:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def _commit(coll, work, spec, encode, record) -> dict:
    """Commit under the writer; an online collection's buffer is sealed first and its lock
    held, so no acknowledged write is left encoded by the old encoder."""
    table = coll.table
    online = coll.live.writes
    if online is None:
        with table.writer() as w:
            out = reencode.commit(w, work, coll.kinds, spec, encode, record)
        table.refresh()
        table.sealed_snapshot()  # the new encoder followed now, not at the next query
        return out
    for _ in range(5):
        online.sealed_through_now()
        with online.seal_lock, online.lock:
            if online.frozen is not None or not online.active.empty():
                continue  # writes landed between the seal and the lock: seal them too
            with table.writer() as w:
                out = reencode.commit(w, work, coll.kinds, spec, encode, record)
            table.refresh()
            online.rebase()
            return out
    raise ResourceExhausted(f"collection {coll.name!r}: writes kept arriving faster than "
                            "they could be sealed before the adapt's commit; try again")
