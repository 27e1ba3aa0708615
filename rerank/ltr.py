"""A trained ranker: a LightGBM model plus the feature schema and transform it was trained on.

Files (a collection artifact ``ranker-<name>``, or the shipped ``models/general``):
``ranker[.<hash>].txt`` (LightGBM text model) and ``ranker[.<hash>].json`` (metadata: format,
feature schema version and names, transform, training summary). The hash in the names makes a
retrained model a new set of files, so caches keyed by file names never serve a stale model.

Transforms turn the schema's feature matrix into the model's input, from the feature names the
model was trained with (``features`` in its metadata: all of ``schema.NAMES`` for a new model,
a prefix of them for one trained before later features were added; plus ``vec_sim@FIELD``
for each named vector field of the collection it was trained on, which must then be the
serving collection's named fields too: ``Ranker.check_names``):
- ``raw``: those columns as computed;
- ``raw+query``: the raw columns followed by copies of their collection-scaled scores
  (``schema.SCALED``) min-max normalized within each query's window (``<name>@q``): the
  default of collection rankers;
- ``general``: ``schema.GENERAL`` features as ranks within the query's window (see
  ``schema``): what the first general ranker, trained on several collections, saw;
- ``normalized``: ``schema.NORMALIZED`` scores each as rank, z-score and ratio to the maximum
  within the query's window, then ``schema.NORMALIZED_AS_IS`` as computed: the transfer
  ranker (issue 21), the shipped ``general`` model.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from polyindex.errors import Corrupt, InvalidArgument
from polyindex.rerank import schema, window
from polyindex.rerank.forest import Forest

FORMAT = 1
TRANSFORMS = ("raw", "raw+query", "general", "normalized")
_GENERAL = np.array([schema.INDEX[n] for n in schema.GENERAL])
_GENERAL_RANKED = np.array([i for i, n in enumerate(schema.GENERAL)
                            if n not in schema.GENERAL_AS_IS])
_NORM = np.array([schema.INDEX[n] for n in schema.NORMALIZED])
_NORM_AS_IS = np.array([schema.INDEX[n] for n in schema.NORMALIZED_AS_IS])
NORMALIZED_NAMES = ([f"{n}@rank" for n in schema.NORMALIZED] + [f"{n}@z" for n in schema.NORMALIZED]
                    + [f"{n}@max" for n in schema.NORMALIZED] + list(schema.NORMALIZED_AS_IS))
# transforms whose model sees no per-field (vec_sim@FIELD) feature: any collection is served
GENERIC = ("general", "normalized")


def model_names(transform: str, base: Sequence[str] = schema.NAMES) -> list[str]:
    """The model's input names for a transform over ``base`` feature names."""
    if transform == "raw":
        return list(base)
    if transform == "general":
        return list(schema.GENERAL)
    if transform == "normalized":
        return list(NORMALIZED_NAMES)
    if transform == "raw+query":
        return list(base) + [f"{n}@q" for n in schema.scaled(base)]
    raise InvalidArgument(f"unknown feature transform {transform!r}; known: {', '.join(TRANSFORMS)}")


def query_minmax(a: np.ndarray, qptr: np.ndarray) -> np.ndarray:
    """Min-max normalize each column within each query's rows (NaN stays NaN; a column
    constant within a query becomes 0)."""
    counts = np.diff(qptr)
    nz = counts > 0
    if not len(a) or not nz.any():
        return a.copy()
    starts = qptr[:-1][nz]
    with np.errstate(invalid="ignore", divide="ignore"):
        lo = np.repeat(np.fmin.reduceat(a, starts, axis=0), counts[nz], axis=0)
        hi = np.repeat(np.fmax.reduceat(a, starts, axis=0), counts[nz], axis=0)
        span = hi - lo
        out = np.where(span > 0, (a - lo) / np.where(span > 0, span, 1), 0)
    out[np.isnan(a)] = np.nan
    return out.astype(np.float32, copy=False)


def transform(kind: str, X: np.ndarray, qptr: np.ndarray,
              base: Sequence[str] = schema.NAMES) -> np.ndarray:
    cols = _columns(tuple(base))
    if kind == "raw":
        return X if cols is None else X[:, cols]
    if kind == "raw+query":
        raw = X if cols is None else X[:, cols]
        return np.hstack([raw, query_minmax(X[:, _scaled(tuple(base))], qptr)])
    if kind == "normalized":
        return normalized(X, qptr)
    Xg = X[:, _GENERAL]
    ranked = Xg[:, _GENERAL_RANKED]
    out = np.empty(ranked.shape, np.float32)
    window.query_ranks(ranked, qptr, out)
    Xg[:, _GENERAL_RANKED] = out
    return Xg


def normalized(X: np.ndarray, qptr: np.ndarray) -> np.ndarray:
    """The ``normalized`` transform: rank, z-score, ratio to max, then the as-is columns."""
    a = np.ascontiguousarray(X[:, _NORM])
    n, k = a.shape
    out = np.empty((n, 3 * k + len(_NORM_AS_IS)), np.float32)
    rank, z, ratio = (np.empty((n, k), np.float32) for _ in range(3))
    window.query_ranks(a, qptr, rank)
    window.query_moments(a, qptr, z, ratio)
    out[:, :k], out[:, k:2 * k], out[:, 2 * k:3 * k] = rank, z, ratio
    out[:, 3 * k:] = X[:, _NORM_AS_IS]
    return out


def _column_of(base: tuple[str, ...]):
    """Column of a name in the feature matrix of a collection whose vector fields are the
    ones ``base`` lists (checked before: ``Ranker.check_names``): they follow ``NAMES``."""
    vec = {n: len(schema.NAMES) + i
           for i, n in enumerate(sorted(n for n in base if schema.is_vector_feature(n)))}
    return lambda n: vec[n] if n in vec else schema.INDEX[n]


@functools.lru_cache(maxsize=64)
def _columns(base: tuple[str, ...]) -> np.ndarray | None:
    """Columns of ``base`` in the feature matrix (None: all of them, in order)."""
    if base == schema.NAMES:
        return None
    col = _column_of(base)
    return np.array([col(n) for n in base], np.int64)


@functools.lru_cache(maxsize=64)
def _scaled(base: tuple[str, ...]) -> np.ndarray:
    col = _column_of(base)
    return np.array([col(n) for n in schema.scaled(base)], np.int64)


class Ranker:
    def __init__(self, booster, meta: dict, what: str = "ranker"):
        if meta.get("format") != FORMAT:
            raise Corrupt(f"{what}: unknown ranker file format {meta.get('format')!r} "
                          f"(this polyindex reads {FORMAT})")
        schema.check(meta.get("schema_version"), meta.get("features", ()), what=what)
        self.booster, self.meta, self.what = booster, meta, what
        self.forest = Forest(booster.model_to_string())
        prior = meta.get("prior") or {}
        self.prior_weight = float(prior.get("weight", 0.0))
        self.prior_col = schema.INDEX.get(prior.get("feature", "rrf"))
        if self.prior_weight and self.prior_col is None:
            raise Corrupt(f"{what}: prior feature {prior.get('feature')!r} is not in the schema")
        # The guard of a model that must not lose to its prior (the shipped general ranker):
        # score = prior + tree_weight x trees, the weight chosen by leave-one-collection-out
        # (bench_ltr part c); 1 for every model trained on its own collection.
        self.tree_weight = float(meta.get("tree_weight", 1.0))
        self.transform = meta.get("transform", "raw")
        self.base = tuple(meta["features"])
        self.names = model_names(self.transform, self.base)
        if booster.num_feature() != len(self.names):
            raise Corrupt(f"{what}: the model has {booster.num_feature()} features, its "
                          f"metadata describes {len(self.names)}")

    def check_names(self, names: Sequence[str]) -> None:
        """Refuse a collection whose named vector fields are not the ones this model was
        trained with (its ``vec_sim@FIELD`` features would mean other vectors, or be absent).
        The general ranker uses no per-field feature and serves any collection."""
        if self.transform in GENERIC:
            return
        have = sorted(n[len(schema.VECTOR_PREFIX):] for n in names if schema.is_vector_feature(n))
        want = sorted(n[len(schema.VECTOR_PREFIX):] for n in self.base
                      if schema.is_vector_feature(n))
        if have != want:
            raise InvalidArgument(
                f"{self.what} was trained on a collection with named vector fields "
                f"{want or 'none'}, this collection has {have or 'none'}; its per-field "
                f"similarity features (vec_sim@FIELD) do not apply: train a ranker for this "
                f"collection (`polyindex train-ranker`)")

    def falls_back(self) -> bool:
        """Its score is the profile's fused score (scaled): trees weighed 0, prior fused_score."""
        return self.tree_weight == 0.0 and self.prior_col == schema.INDEX["fused_score"] \
            and self.prior_weight > 0

    def inputs(self, X: np.ndarray, qptr: np.ndarray) -> np.ndarray:
        return transform(self.transform, X, qptr, self.base)

    def prior(self, X: np.ndarray) -> np.ndarray:
        """The score boosting started from (``init_score`` at training): weight x a feature."""
        if not self.prior_weight:
            return np.zeros(len(X))
        return self.prior_weight * X[:, self.prior_col].astype(np.float64)

    def predict(self, X: np.ndarray, qptr: np.ndarray) -> np.ndarray:
        """Model scores of schema feature rows (queries' rows delimited by ``qptr``)."""
        # numba tree walk: equal to booster.predict (tests), several times faster on a window
        trees = self.forest.predict(self.inputs(X, qptr))
        return (trees if self.tree_weight == 1.0 else self.tree_weight * trees) + self.prior(X)

    def contributions(self, X: np.ndarray, qptr: np.ndarray) -> tuple[list[str], np.ndarray]:
        """Names and (n, names) contributions: per model feature (LightGBM pred_contrib, SHAP),
        ``bias`` (the trees' expected value) and ``prior``, the trees' part times
        ``tree_weight``; a row sums to its score."""
        c = self.tree_weight * self.booster.predict(self.inputs(X, qptr), pred_contrib=True,
                                                    num_threads=1)
        return self.names + ["bias", "prior"], np.hstack([c, self.prior(X)[:, None]])

    # -- files ---------------------------------------------------------------------------
    def save(self, folder: Path, stem: str = "ranker", hashed: bool = True) -> list[str]:
        text = self.booster.model_to_string()
        meta = json.dumps(self.meta, indent=1, sort_keys=True)
        if hashed:
            stem = f"{stem}.{hashlib.sha1((text + meta).encode()).hexdigest()[:12]}"
        (folder / f"{stem}.txt").write_text(text)
        (folder / f"{stem}.json").write_text(meta + "\n")
        return [f"{stem}.txt", f"{stem}.json"]

    @classmethod
    def load(cls, folder: Path, files: list[str], what: str) -> "Ranker":
        import lightgbm as lgb
        model = [f for f in files if f.endswith(".txt")]
        meta = [f for f in files if f.endswith(".json")]
        if len(model) != 1 or len(meta) != 1:
            raise Corrupt(f"{what}: expected one .txt model and one .json metadata file, "
                          f"got {files}")
        try:
            meta_data = json.loads((folder / meta[0]).read_text())
            booster = lgb.Booster(model_str=(folder / model[0]).read_text())
        except (OSError, ValueError, lgb.basic.LightGBMError) as e:
            raise Corrupt(f"{what}: cannot read {folder}: {e}") from None
        return cls(booster, meta_data, what)


def new_meta(transform: str, prior_weight: float = 0.0, names: Sequence[str] = schema.NAMES,
             prior_feature: str = "rrf", **summary) -> dict:
    """``names``: the training collection's feature names (``schema.names_for``)."""
    model_names(transform)  # validates
    if transform in GENERIC:  # what transfers across collections: no per-field feature
        names = schema.NAMES
    return {"format": FORMAT, "schema_version": schema.VERSION, "features": list(names),
            "transform": transform, "prior": {"feature": prior_feature, "weight": float(prior_weight)},
            **summary}
