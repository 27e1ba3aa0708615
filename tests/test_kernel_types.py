"""Every numba kernel is compiled once per argument type, and a read-only array (a mapped
file) is another type than a writable one (so is one of another layout): a kernel that is
handed both compiles twice, and the first query to meet the second kind stops for the
compile (3.3-3.9 s mid-query in bench_living, stop 33). Over a workload of every index kind
and profile (two segments, deletes, filters, a compaction), no kernel may end up with two
specializations that differ only in their arrays' mutability or layout.

The workload runs in a fresh process: the unit tests before it hand kernels arrays of every
kind on purpose.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_integrity import KINDS, PROFILES, make_docs, queries
from test_shards import trees_models

FILTERS = [None, {"year": {"lt": 1963}}, {"not": {"year": 1961}}]


def _shape(sig) -> tuple:
    """A signature less what only mutability and layout tell apart."""
    from numba import types
    return tuple((t.dtype, t.ndim) if isinstance(t, types.Array) else t for t in sig)


def _compiled_twice() -> dict[str, dict[int, list[str]]]:
    """Per kernel of polyindex with such twins: the arguments that differ, and their types."""
    from numba.core.registry import CPUDispatcher
    twice = {}
    for name, mod in list(sys.modules.items()):
        if not name.startswith("polyindex") or mod is None:
            continue
        for attr, kernel in vars(mod).items():
            if not isinstance(kernel, CPUDispatcher):
                continue
            shapes: dict = {}
            for sig in kernel.signatures:
                shapes.setdefault(_shape(sig), []).append(sig)
            for sigs in shapes.values():
                if len(sigs) > 1:
                    twice[f"{kernel.__module__}.{attr}"] = {
                        i: sorted({str(sig[i]) for sig in sigs})
                        for i in range(len(sigs[0])) if len({sig[i] for sig in sigs}) > 1}
    return twice


def _workload(folder: Path) -> None:
    import polyindex
    from polyindex.query.filters import compile_filter
    from polyindex.query.pipeline import run
    from polyindex.query.profiles import LTR, resolve_profile
    from polyindex.rerank import registry
    from polyindex.types import Document

    registry.SHIPPED = trees_models(folder / "models")
    coll = polyindex.open(folder / "data").create_collection("c", KINDS, fields={"year": "int"})
    docs, emb, toks = make_docs(180, seed=5)
    docs = [Document(d.id, d.title, d.text, {"year": 1960 + i % 5}) for i, d in enumerate(docs)]
    with coll.table.writer() as w:
        w.commit_segment(docs[:120], coll.config.fields, embeddings=emb[:120], tokens=toks[:120])
        w.commit_segment(docs[120:], coll.config.fields, embeddings=emb[120:], tokens=toks[120:],
                         delete_ids=["d3", "d7"])
    trees = {**LTR, "rerank": {"model": "trees", "window": 100}}  # every rerank feature

    def query_all():
        snap = coll.view()
        filters = [f if f is None else compile_filter(f, coll.config.fields) for f in FILTERS]
        for name in [*PROFILES, "hybrid", "ltr", trees]:
            prof = resolve_profile(name, list(coll.kinds), {})
            for flt in filters:
                hits = run(snap, queries(), prof, 10, filter_expr=flt)
                assert any(hits), (name, flt)

    query_all()
    assert coll.delete(["d20", "d130"]) == 2  # live masks made in memory
    query_all()
    coll.compact()
    query_all()


def test_no_kernel_compiles_twice_for_a_mutable_or_other_layout_array(tmp_path: Path):
    proc = subprocess.run([sys.executable, __file__, str(tmp_path)], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {}


if __name__ == "__main__":
    _workload(Path(sys.argv[1]))
    print(json.dumps(_compiled_twice()))
