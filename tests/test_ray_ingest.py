"""``polyindex index --ray``: the collection Ray builds equals the single-process bulk ingest
of the same source (ids, stored text and vectors, lexical and dense results), across ranges
with duplicate ids and an invalid record, with a trained index kind; an error mid-run
leaves a committed prefix a rerun resumes after; the real model's vectors agree within bf16;
the CLI flags. One local, loopback-only Ray for the module (2 CPUs, a small object store).
Without Ray installed, the CLI's ``--ray`` says how to install it (that test needs no Ray).
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import make_corpus
from polyindex.config import DEFAULT_MODEL
from polyindex.engine import Engine
from polyindex.errors import InputError
from polyindex.ingest.sources import open_source

DEMO = Path(__file__).resolve().parents[1] / "engine" / "cli" / "demo_data" / "cranfield"
DIM = 8
BAD_AT = 50  # position of the record with no id


@pytest.fixture(scope="module")
def ray_cluster():
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'ray[data]')")
    from polyindex.distributed import cluster
    ray = cluster.start(num_cpus=2, object_store_bytes=96 * 1024 * 1024)
    yield ray
    ray.shutdown()


def vector_corpus(path: Path, n: int = 70) -> list[dict]:
    """Records with duplicate ids (within and across ranges of 16), an 8-d vector each and
    one record without an id at position BAD_AT."""
    records = make_corpus(path, n, seed=7)
    rng = random.Random(3)
    for r in records:
        r["vector"] = [rng.uniform(-1, 1) for _ in range(DIM)]
    records[20]["_id"] = records[18]["_id"]  # a duplicate inside one range
    records[40]["_id"] = records[5]["_id"]   # and one across ranges
    lines = [json.dumps(r) for r in records]
    lines[BAD_AT] = json.dumps({"title": "no id", "text": "a record without an id"})
    path.write_text("\n".join(lines) + "\n")
    return [r for i, r in enumerate(records) if i != BAD_AT]


def new_collection(folder: Path, indexes=("lexical", "dense:IVF2,Flat"), segment_size=16,
                   **kw):
    eng = Engine(folder)
    kw.setdefault("model", None)
    return eng, eng.create_collection("c", list(indexes), segment_size=segment_size, **kw)


def assert_same(a, b, ids: list[str], queries: list[str], vectors: np.ndarray | None,
                atol: float = 0.0):
    """Same documents (text, stored vectors within ``atol``), same lexical and dense hits."""
    assert a.count() == b.count() == len(ids)
    da, db = a.get(ids, with_vectors=True), b.get(ids, with_vectors=True)
    for x, y in zip(da, db):
        assert x is not None and y is not None
        assert (x.id, x.title, x.text) == (y.id, y.title, y.text)
        np.testing.assert_allclose(x.vectors["dense"], y.vectors["dense"], atol=atol, rtol=0)
    for q in queries:
        ha, hb = a.query(q, k=10, profile="lexical"), b.query(q, k=10, profile="lexical")
        assert ha, q
        assert [h.id for h in ha] == [h.id for h in hb]
        np.testing.assert_allclose([h.score for h in ha], [h.score for h in hb], rtol=1e-6)
    for v in vectors if vectors is not None else ():
        ha = a.query(vector=v, k=5, profile="dense")
        hb = b.query(vector=v, k=5, profile="dense")
        assert [h.id for h in ha] == [h.id for h in hb]


def leftovers(coll) -> list[str]:
    return [p.name for p in (coll.folder / "segments").iterdir() if p.name.startswith(".")]


def test_ray_equals_bulk_and_resumes_after_an_error(ray_cluster, tmp_path):
    from polyindex.distributed.ingest import ray_index
    src = tmp_path / "docs.jsonl"
    records = vector_corpus(src)
    last = {r["_id"]: r for r in records}
    _, ref = new_collection(tmp_path / "bulk")
    ref.index(src, skip_invalid=True)

    _, coll = new_collection(tmp_path / "ray")
    # Ranges [0,16) [16,32) [32,48) commit; [48,64) holds the bad record: the run stops there
    with pytest.raises(InputError, match=f"docs.jsonl:{BAD_AT + 1}, field .id.: missing id"):
        ray_index(coll, open_source(src), encoders=2, progress=False)
    job = coll.table.sealed_snapshot().manifest.ingest
    assert job["position"] == 48 and not job["done"]
    assert coll.count() == len({r["_id"] for r in records[:48]})
    assert leftovers(coll) == []

    report = ray_index(coll, open_source(src), encoders=2, skip_invalid=True, progress=False)
    assert report.resumed_from == 48 and report.skipped_invalid == 1
    assert coll.table.sealed_snapshot().manifest.ingest["done"]
    assert len(coll.table.sealed_snapshot().manifest.segments) == 5  # 70 records by 16
    assert coll.table.artifacts()  # the IVF template, trained by the first range's worker
    assert leftovers(coll) == []
    queries = [last[i]["text"].split()[0] for i in sorted(last)[:8]] + ["river ocean", "alpha"]
    probe = np.array([last[i]["vector"] for i in sorted(last)[:6]], dtype=np.float32)
    assert_same(ref, coll, sorted(last), queries, probe)
    again = ray_index(coll, open_source(src), encoders=1, skip_invalid=True, progress=False)
    assert again.already_indexed


def test_model_vectors_agree_within_bf16(ray_cluster, tmp_path):
    """The real model (bf16) on 8 demo documents, ranges of 3 on one encoder actor."""
    from polyindex.distributed.ingest import ray_index
    src = tmp_path / "cran.jsonl"
    lines = (DEMO / "corpus.jsonl").read_text().splitlines()[:8]
    src.write_text("\n".join(lines) + "\n")
    ids = sorted(json.loads(x)["_id"] for x in lines)
    _, ref = new_collection(tmp_path / "bulk", ["lexical", "dense"], model=DEFAULT_MODEL)
    ref.index(src)
    _, coll = new_collection(tmp_path / "ray", ["lexical", "dense"], segment_size=3,
                             model=DEFAULT_MODEL)
    report = ray_index(coll, open_source(src), encoders=1, progress=False)
    assert report.indexed == 8 and report.segments == 3
    # bf16 embeddings differ slightly with the batch a text is encoded in
    assert_same(ref, coll, ids, ["boundary layer", "supersonic flow heat"], None, atol=2e-2)


def test_cli_ray_flags(ray_cluster, tmp_path):
    from typer.testing import CliRunner

    from polyindex.cli.main import app
    src = tmp_path / "docs.jsonl"
    records = vector_corpus(src, n=60)
    args = ["index", str(src), "--data", str(tmp_path / "d"), "-c", "c", "--model", "none",
            "--index", "lexical", "--index", "dense", "--segment-size", "16", "--skip-invalid",
            "--ray", "--encoders", "2", "--no-progress", "--json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["documents"] == len({r["_id"] for r in records}) and out["skipped_invalid"] == 1
    bad = CliRunner().invoke(app, ["index", str(src), "--data", str(tmp_path / "e"), "-c", "c",
                                   "--encoders", "2"])
    assert bad.exit_code != 0 and "go with --ray" in str(bad.exception)
    gpu = CliRunner().invoke(app, args[:-4] + ["--gpus-per-encoder", "1", "--no-progress"])
    assert gpu.exit_code != 0 and "the Ray cluster has 0" in str(gpu.exception)


def test_cli_ray_without_ray_says_how_to_install(tmp_path):
    """Ray made unimportable in a fresh interpreter: one line with the install command,
    exit 2, nothing created."""
    src = tmp_path / "docs.jsonl"
    src.write_text('{"_id": "a", "text": "hello"}\n')
    code = ("import sys; sys.modules['ray'] = None; from polyindex.cli.main import main; "
            f"sys.argv = ['polyindex', 'index', {str(src)!r}, '--data', "
            f"{str(tmp_path / 'd')!r}, '-c', 'c', '--ray']; main()")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2, res.stderr
    # the package itself: 'polyindex[ray]' fails where polyindex is not on the index
    assert "Ray is not installed: pip install 'ray[data]" in res.stderr
    assert not (tmp_path / "d").exists()
