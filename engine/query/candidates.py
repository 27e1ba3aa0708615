"""Ranker training data from the query pipeline, and storing a trained ranker.

``collect`` runs queries through a profile exactly as serving does up to the rerank stage
(same retrieve stages, fusion and window) and computes the same features, so a model sees at
training time what it will see when it serves. ``store`` writes a model into a collection with
a rank profile of the same name (retrieve stages of the candidates' profile, RRF fusion,
rerank window).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from polyindex.config import validate_name
from polyindex.errors import InvalidArgument
from polyindex.index.protocol import Query
from polyindex.query.pipeline import allow_masks, blind_keys, fuse, retrieve
from polyindex.query.profiles import Profile, builtin_profiles
from polyindex.rerank import features
from polyindex.rerank.ltr import Ranker
from polyindex.rerank.registry import artifact_name
from polyindex.rerank.train import Candidates


def collect(coll, queries: Sequence[tuple[str, str]], qrels: dict | None, *,
            profile: str = "hybrid", window: int = 100, batch: int = 64,
            vectors: np.ndarray | None = None,
            field_vectors: dict[str, np.ndarray] | None = None) -> Candidates:
    """Candidates (the profile's fused top ``window``) and features of ``queries``
    (``vectors``: their embeddings, when already computed; ``field_vectors``: per named
    vector field, the queries' vectors in query order, (nq, d), for its retrieve stage and
    its ``vec_sim@FIELD`` feature)."""
    prof = coll._profile(profile)
    if prof.rerank is not None:
        raise InvalidArgument(f"profile {profile!r} already reranks; candidates come from a "
                              f"profile without a rerank stage (e.g. hybrid)")
    snap = coll.view()
    allow = allow_masks(snap, None)
    needs_vec = any(coll.kinds[st.index].needs_embeddings for st in prof.retrieve)
    names = [st.index for st in prof.retrieve]
    parts = []
    for start in range(0, len(queries), batch):
        chunk = queries[start:start + batch]
        qs = [Query(text=t, vectors={f: np.asarray(m[start + i], np.float32)
                                     for f, m in (field_vectors or {}).items()})
              for i, (_, t) in enumerate(chunk)]
        if needs_vec:
            vecs = vectors[start:start + batch] if vectors is not None else \
                coll.encoder.encode([t for _, t in chunk], chunk=len(chunk))
            for q, v in zip(qs, vecs):
                q.vector = np.asarray(v, np.float32)
        results = [retrieve(snap, qs, st.index, st.k, st.params, allow) for st in prof.retrieve]
        lists = [[(s[i], k[i]) for s, k in results] for i in range(len(qs))]
        blind = blind_keys(snap, prof, results)
        cands = [fuse(prof, ls, window, blind) for ls in lists]
        X, qptr = features.compute(snap, qs, cands, lists, names, blind)
        keys = np.concatenate([k for k, _ in cands]) if cands else np.zeros(0, np.int64)
        ids = snap.ids_of(keys) if len(keys) else []
        labels = np.zeros(len(ids), np.float32)
        if qrels is not None:
            qid_of = np.repeat([q for q, _ in chunk], np.diff(qptr))
            labels[:] = [max(qrels.get(q, {}).get(d, 0), 0) for q, d in zip(qid_of, ids)]
        parts.append(Candidates([q for q, _ in chunk], X, qptr, labels, ids,
                                np.concatenate([s for _, s in cands]).astype(np.float64),
                                names=features.names(snap)))
    out = Candidates.concat(parts) if parts else Candidates(
        [], np.zeros((0, len(features.names(snap))), np.float32), np.zeros(1, np.int64),
        np.zeros(0, np.float32), [], np.zeros(0), names=features.names(snap))
    out.meta = {"collection": coll.name, "profile": profile, "window": window,
                "retrieve": prof.to_json()["retrieve"]}
    return out


def store(coll, name: str, ranker: Ranker, *, window: int, retrieve: list[dict]) -> dict:
    """Write a ranker into a collection with a rank profile named after it; returns the profile."""
    validate_name(name, "ranker")
    if name in builtin_profiles(list(coll.kinds)):
        raise InvalidArgument(f"ranker name {name!r} is a built-in profile name; choose another")
    profile = {"retrieve": retrieve, "fuse": {"method": "rrf", "k": 60},
               "rerank": {"model": name, "window": window}}
    Profile.from_json(name, profile, set(coll.kinds))
    art = artifact_name(name)
    previous = set(coll.table.artifacts().get(art, []))
    folder = coll.table.artifact_dir(art)
    files = ranker.save(folder)
    coll.table.commit_metadata(artifacts={art: files}, profiles={name: profile})
    for p in folder.iterdir():  # keep the new files and the previous ones (open snapshots)
        if p.name not in files and p.name not in previous:
            p.unlink()
    return profile
