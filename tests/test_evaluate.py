"""`polyindex eval` scoring: means over the judged queries, a query without hits counting 0."""
import pytest

from polyindex.cli.evaluate import evaluate_run, write_trec


def test_judged_query_without_hits_counts_zero_once(tmp_path):
    qrels = {"q1": {"d1": 1}, "q2": {"d2": 1}, "q3": {"d3": 1}, "q4": {"d4": 2}}
    run = {"q1": [("d1", 3.0), ("x", 1.0)],     # perfect
           "q2": [("x", 2.0), ("d2", 1.0)],     # relevant at rank 2
           "q3": [],                            # no hits: 0
           "unjudged": [("d1", 1.0)]}           # not in the qrels: ignored
    path = tmp_path / "run.trec"
    write_trec(path, run, "t")                  # q4 is absent from the run: 0 too
    import math
    got = evaluate_run(path, qrels)
    assert got["nDCG@10"] == pytest.approx((1.0 + 1 / math.log2(3)) / 4)
    assert got["MRR@10"] == pytest.approx((1.0 + 0.5) / 4)
    assert got["R@100"] == pytest.approx(2 / 4)
