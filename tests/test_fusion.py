"""Fusion weights: a weighted reciprocal rank fusion (per-leg weights in a profile's fuse
section), validated when a profile is read."""
import numpy as np
import pytest

from polyindex import InvalidArgument
from polyindex.query.profiles import Profile, builtin_profiles
from polyindex.rerank import fusion


def test_rrf_weights_scale_each_list():
    a, b = np.array([3, 1, 2, -1]), np.array([1, 2, 9])
    keys, scores = fusion.rrf([a, b], k=60, weights=[1.0, 2.0])
    got = dict(zip(keys.tolist(), scores.tolist()))
    assert got[1] == pytest.approx(1 / 62 + 2 / 61) and got[9] == pytest.approx(2 / 63)
    assert got[3] == pytest.approx(1 / 61) and -1 not in got
    assert keys.tolist() == [1, 2, 9, 3]  # the heavier list decides; equal weights would not
    even, _ = fusion.rrf([a, b], k=60)
    assert even.tolist() == [1, 2, 3, 9]
    # weight 0 drops a list's say entirely; the unweighted call is weights of 1
    only_b, _ = fusion.rrf([a, b], k=60, weights=[0.0, 1.0])
    assert only_b[:3].tolist() == [1, 2, 9]
    assert np.allclose(fusion.rrf([a, b])[1], fusion.rrf([a, b], weights=[1, 1])[1])


def test_profile_weights_are_checked():
    kinds = {"lexical", "dense"}
    ok = {"retrieve": [{"index": "lexical"}, {"index": "dense"}],
          "fuse": {"method": "rrf", "k": 60, "weights": {"dense": 2}}}
    assert Profile.from_json("p", ok, kinds).fuse["weights"] == {"dense": 2}
    for weights in ({"sparse": 1}, {"dense": -1}, {"dense": "x"}, {"dense": True}, [1, 2]):
        with pytest.raises(InvalidArgument):
            Profile.from_json("p", {**ok, "fuse": {"method": "rrf", "weights": weights}}, kinds)


def test_builtin_hybrids_are_valid_profiles():
    kinds = ["lexical", "dense", "multivector", "sparse", "tree"]
    for name, data in builtin_profiles(kinds).items():
        p = Profile.from_json(name, data, set(kinds))
        assert set(p.fuse.get("weights", {})) <= {s.index for s in p.retrieve}


def test_adapted_weights_follow_how_peaked_the_list_is():
    peaked = np.array([10.0, 2.0, 1.9, 1.8] + [1.0] * 96)   # the top stands out: peak low
    flat = np.linspace(10.0, 9.0, 100)                      # all alike near the top: peak high
    assert fusion.peak(flat) > 0.9 > 0.3 > fusion.peak(peaked)
    w_flat = fusion.adapted_weights([0.45, 0.55], 1, flat, 0.15, 0.7)
    w_peak = fusion.adapted_weights([0.45, 0.55], 1, peaked, 0.15, 0.7)
    # slope > 0: the dense weight rises with the peak statistic; the total is kept
    assert w_flat[1] > 0.55 > w_peak[1] and sum(w_flat) == pytest.approx(1.0)
    assert w_flat[1] == pytest.approx(0.55 + 0.15 * (fusion.peak(flat) - 0.7))
    # clipped to [0.05, 0.95] of the total; the other lists keep their proportions
    assert fusion.adapted_weights([0.5, 0.5], 0, flat, 100.0, 0.0) == pytest.approx([0.95, 0.05])
    three = fusion.adapted_weights([1.0, 2.0, 1.0], 1, peaked, -1.0, 0.7)
    assert sum(three) == pytest.approx(4.0) and three[0] == pytest.approx(three[2])
    # only the first 100 scores count: what lies below cannot move the weight
    assert fusion.peak(np.concatenate([flat, [-1e9]])) == fusion.peak(flat)
    assert fusion.peak(np.array([])) == 0.0 and fusion.peak(np.array([3.0, 3.0])) == 1.0


def test_pipeline_fuses_each_query_with_its_own_weights():
    from polyindex.query.pipeline import fuse
    kinds = {"lexical", "dense"}
    prof = Profile.from_json("hybrid-adaptive", builtin_profiles(sorted(kinds))["hybrid-adaptive"],
                             kinds)
    rng = np.random.default_rng(4)
    lex_keys = rng.permutation(300)[:200].astype(np.int64)
    lex_scores = np.sort(rng.random(200))[::-1] * 20
    dense_keys = np.concatenate([rng.permutation(300)[:150], np.full(10, -1)]).astype(np.int64)
    for dense_scores in (np.linspace(0.9, 0.8, 150), np.r_[0.9, np.linspace(0.5, 0.4, 149)]):
        padded = np.r_[dense_scores, np.full(10, -np.inf)].astype(np.float32)
        got = fuse(prof, [(lex_scores, lex_keys), (padded, dense_keys)], 50)
        w = fusion.adapted_weights([0.45, 0.55], 1, padded[:150], 0.15, 0.7)
        want = fusion.weighted([lex_keys, dense_keys], [lex_scores, padded], w)
        assert np.array_equal(got[0], want[0][:50]) and np.allclose(got[1], want[1][:50])
    flat = fusion.adapted_weights([0.45, 0.55], 1, np.linspace(0.9, 0.8, 150), 0.15, 0.7)
    steep = fusion.adapted_weights([0.45, 0.55], 1, np.r_[0.9, np.linspace(0.5, 0.4, 149)],
                                   0.15, 0.7)
    assert flat[1] > steep[1]  # the two queries were fused with different weights


def test_profile_adapt_is_checked():
    kinds = {"lexical", "dense"}
    ok = {"retrieve": [{"index": "lexical"}, {"index": "dense"}],
          "fuse": {"method": "weighted", "weights": {"lexical": 0.4, "dense": 0.6},
                   "adapt": {"index": "dense", "slope": 0.2, "centre": 0.7}}}
    assert Profile.from_json("p", ok, kinds).fuse["adapt"]["slope"] == 0.2
    bad = [{**ok["fuse"], "method": "rrf"},                                   # RRF: no scores
           {**ok["fuse"], "adapt": {"index": "sparse", "slope": 0.2, "centre": 0.7}},
           {**ok["fuse"], "adapt": {"index": "dense", "slope": "x", "centre": 0.7}},
           {**ok["fuse"], "adapt": {"index": "dense", "slope": True, "centre": 0.7}},
           {**ok["fuse"], "adapt": {"index": "dense", "slope": 0.2}},
           {**ok["fuse"], "adapt": {"index": "dense", "slope": float("nan"), "centre": 0.7}},
           {**ok["fuse"], "adapt": [0.2]}]
    for fuse in bad:
        with pytest.raises(InvalidArgument, match="fuse.adapt"):
            Profile.from_json("p", {**ok, "fuse": fuse}, kinds)
    with pytest.raises(InvalidArgument, match="fuse.adapt"):
        Profile.from_json("p", {"retrieve": [{"index": "dense"}],
                                "fuse": {**ok["fuse"], "weights": {"dense": 1}}}, kinds)
