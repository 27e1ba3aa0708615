"""Scoring a LightGBM model's trees in numba (serving path; LightGBM itself explains).

``Booster.predict`` costs ~1-2 ms for a 100-row window of a few hundred trees (per-call set-up,
per-row conversion, OpenMP), more than the whole rerank budget; walking the same trees in a
numba loop takes a fraction of that. The trees are read from the LightGBM text model, which
holds LightGBM's own arrays (children: >= 0 internal node, < 0 ``~leaf``), and decisions
follow LightGBM's ``NumericalDecision``: NaN is 0 unless the split's missing type is NaN; a
missing value (NaN for type NaN, zero for type Zero) goes to the default side; else
``x <= threshold`` goes left. Categorical splits are not supported (we train none).
"""
from __future__ import annotations

import numba
import numpy as np

from polyindex.errors import Corrupt

_KZERO = 1e-35  # LightGBM's kZeroThreshold


class Forest:
    def __init__(self, model_text: str):
        trees = [_parse_tree(block) for block in model_text.split("\nTree=")[1:]]
        trees = [t for t in trees if t is not None]
        roots, feat, thr, left, right, dtype, leaves = [], [], [], [], [], [], []
        n_nodes = n_leaves = 0
        for t in trees:
            nl = len(t["leaf_value"])
            if nl == 1 or "split_feature" not in t:
                roots.append(~n_leaves)
            else:
                roots.append(n_nodes)
                for child, out in ((t["left_child"], left), (t["right_child"], right)):
                    c = np.asarray(child, np.int64)
                    out.append(np.where(c >= 0, c + n_nodes, ~(~c + n_leaves)))
                feat.append(np.asarray(t["split_feature"], np.int64))
                thr.append(np.asarray(t["threshold"], np.float64))
                dtype.append(np.asarray(t["decision_type"], np.int64))
                n_nodes += len(t["split_feature"])
            leaves.append(np.asarray(t["leaf_value"], np.float64))
            n_leaves += nl
        cat = np.concatenate(dtype) if dtype else np.zeros(0, np.int64)
        if (cat & 1).any():
            raise Corrupt("ranker model has categorical splits, which polyindex does not score")
        feat = np.concatenate(feat) if feat else np.zeros(0, np.int64)
        thr = np.concatenate(thr) if thr else np.zeros(0)
        default_left = (cat >> 1) & 1 == 1
        missing = (cat >> 2) & 3  # 0 None, 1 Zero, 2 NaN
        self.roots = np.asarray(roots, np.int32)
        self.feat = feat.astype(np.int32)
        # Features are float32, so x <= thr (LightGBM compares in double) exactly when x <= the
        # largest float32 <= thr: float32 thresholds halve the nodes' bytes (cache misses).
        thr32 = thr.astype(np.float32)
        self.thr = np.where(thr32.astype(np.float64) > thr,
                            np.nextafter(thr32, np.float32(-np.inf)), thr32).astype(np.float32)
        self.child = np.empty(2 * len(feat), np.int32)  # [left, right] of each node
        if len(feat):
            self.child[0::2] = np.concatenate(left)
            self.child[1::2] = np.concatenate(right)
        # Where a NaN goes: the default side (types NaN, Zero: NaN counts as 0, a zero is
        # missing) or where 0 would go (type None); zero_missing: type Zero.
        self.nan_right = np.where(missing == 0, 0.0 > thr, ~default_left)
        self.zero_missing = missing == 1
        self.default_right = ~default_left
        self.leaf = np.concatenate(leaves) if leaves else np.zeros(0)
        self.n_trees = len(trees)

    def predict(self, X: np.ndarray) -> np.ndarray:
        out = np.empty(len(X), np.float64)
        if X.dtype != np.float32:
            raise TypeError("Forest.predict takes float32 features (the schema's type)")
        _predict(np.ascontiguousarray(X), self.roots, self.feat, self.thr, self.child,
                 self.nan_right, self.zero_missing, self.default_right, self.leaf, out)
        return out


def _parse_tree(block: str) -> dict | None:
    t = {}
    for line in block.splitlines()[1:]:
        if not line.strip():
            break
        key, sep, value = line.partition("=")
        if sep:
            t[key] = value
    if "leaf_value" not in t:
        return None
    num = {"split_feature": int, "decision_type": int, "left_child": int, "right_child": int,
           "threshold": float, "leaf_value": float}
    return {k: [cast(v) for v in t[k].split()] for k, cast in num.items() if k in t}


@numba.njit(cache=True, nogil=True)
def _predict(X, roots, feat, thr, child, nan_right, zero_missing, default_right, leaf, out):
    # Tree by tree, all rows of the window advanced one level at a time: the rows' walks are
    # independent, so the CPU overlaps them, and a tree's nodes stay in cache meanwhile.
    n = X.shape[0]
    out[:] = 0.0
    cur = np.empty(n, np.int32)
    for t in range(len(roots)):
        r0 = roots[t]
        cur[:] = r0
        active = r0 >= 0
        while active:
            active = False
            for i in range(n):
                node = cur[i]
                if node >= 0:
                    x = X[i, feat[node]]
                    if np.isnan(x):
                        right = nan_right[node]
                    elif zero_missing[node] and -_KZERO <= x <= _KZERO:
                        right = default_right[node]
                    else:
                        right = x > thr[node]
                    cur[i] = child[2 * node + right]
                    active = True
        for i in range(n):
            out[i] += leaf[~cur[i]]
