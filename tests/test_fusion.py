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
