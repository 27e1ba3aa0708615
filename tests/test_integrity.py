"""Integrity of stored files: byte flips and truncation of every stored file kind give
Corrupt (DATA_LOSS) naming the file, never a crash, another error, wrong content or a
missing row; paths from a manifest stay inside the collection; ``polyindex verify`` lists
every damaged file; and the commit path fsyncs every file a manifest names, and its folder,
before that manifest is renamed into place (the power-loss order, from the failpoint log).

Damaged copies are opened and queried in a subprocess (one for all cases), so a SIGSEGV
fails the test instead of killing pytest. The collection is built without the model: the
writer is handed small generated embeddings and token vectors (d=32).
"""
from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

D = 32
WORDS = ("boundary layer flow wing supersonic heat transfer shock wave pressure cylinder "
         "turbulent laminar plate nozzle jet vortex drag lift panel flutter").split()
KINDS = ["lexical", "dense:IVF4,Flat", "sparse:UHD4096,k=16,epochs=1", "tree:branch=4,leaf=8",
         "multivector:KMeans16,residual=PQ4"]
PROFILES = ["lexical", "dense", "sparse", "tree", "multivector"]
SEGMENT_FILES = sorted([
    "docs.arrow", "ids.index.arrow", "lexical.vocab.arrow", "lexical.postings.arrow", "lexical.doclen.arrow",
    "lexical.forward.arrow", "lexical.blocks.arrow", "lexical.wide.arrow", "dense.faiss",
    "sparse.terms.arrow", "sparse.postings.arrow",
    "tree.nodes.arrow", "tree.docs.arrow", "multivector.tokens.arrow", "multivector.docs.arrow",
    "multivector.ivf.arrow"])
ARTIFACT_FILES = sorted(["dense/dense.template.faiss", "sparse/sparse.projector.npz",
                         "sparse/sparse.projector.json", "multivector/multivector.codebook.npz",
                         "multivector/multivector.codebook.json",
                         "quality/lm.npz", "quality/quality.txt"])  # issue 21 part 4
DAMAGES = ["flip-start", "flip-middle", "flip-end", "truncate"]
N_FIRST, N_SECOND = 120, 60
DELETED = ["d3", "d7", "d11"]


# ------------------------------------------------------------------ generated data

def unit(x):
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def make_docs(n: int, seed: int):
    """Documents with text, a d=32 embedding and clustered d=32 token vectors."""
    from polyindex.index.protocol import DocTokens
    from polyindex.types import Document
    rng = np.random.default_rng(seed)
    centres = unit(rng.standard_normal((8, D)))
    docs, emb, toks = [], [], []
    for i in range(n):
        topic = int(rng.integers(8))
        words = rng.choice(WORDS, 12)
        docs.append(Document(f"d{i}", f"t{i}", f"v{i} " + " ".join(words), {}))
        emb.append(centres[topic] + 0.3 * rng.standard_normal(D))
        m = int(rng.integers(3, 12))
        t = unit(centres[topic] + 0.4 * rng.standard_normal((m, D)))
        special = np.zeros(m, bool)
        special[0] = True
        toks.append(DocTokens(t.astype(np.float16), special, rng.random(m).astype(np.float32),
                              rng.integers(0, 50, size=m).astype(np.int32)))
    return docs, unit(np.array(emb)), toks


def queries():
    from polyindex.index.protocol import Query
    rng = np.random.default_rng(99)
    out = []
    for i in range(3):
        out.append(Query(text=f"{WORDS[i]} {WORDS[i + 5]} flow", vector=unit(rng.standard_normal(D)),
                         extra={"tokens": unit(rng.standard_normal((4, D)))}))
    return out


def build(data: Path) -> Path:
    """Collection ``c``: two segments (every kind), tombstones from deletes and an upsert,
    the trained artifacts of dense (IVF template), sparse (projector) and multivector
    (codebook)."""
    import polyindex
    coll = polyindex.open(data).create_collection("c", KINDS)
    docs, emb, toks = make_docs(N_FIRST + N_SECOND, seed=5)
    second = docs[N_FIRST:]
    second[0] = type(second[0])("d0", "t0 again", "v0 replaced upsert", {})  # upsert of d0
    with coll.table.writer() as w:
        w.commit_segment(docs[:N_FIRST], {}, embeddings=emb[:N_FIRST], tokens=toks[:N_FIRST])
        w.commit_segment(second, {}, embeddings=emb[N_FIRST:], tokens=toks[N_FIRST:],
                         delete_ids=DELETED)
    return coll.folder


def probe(data: Path) -> dict:
    """What a reader sees: hits of every profile, every document, the count; then a delete
    (the writer opens documents and tombstones too)."""
    import polyindex
    from polyindex.query.pipeline import run
    from polyindex.query.profiles import resolve_profile
    out: dict = {}
    coll = polyindex.open(data).collection("c")
    snap = coll.view()
    for name in PROFILES:
        prof = resolve_profile(name, list(coll.kinds), {})
        hits = run(snap, queries(), prof, 10, with_text=True)
        out[name] = [[(h.id, round(float(h.score), 5), h.text) for h in q] for q in hits]
    ids = [f"d{i}" for i in range(N_FIRST + N_SECOND)]
    out["docs"] = [None if d is None else [d.id, d.title, d.text] for d in coll.get(ids)]
    out["count"] = coll.count()
    out["deleted"] = coll.delete(["d20"])
    return out


def damage(path: Path, how: str) -> None:
    raw = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(bytes(raw[: len(raw) // 2]))
        return
    at = {"flip-start": 0, "flip-middle": len(raw) // 2, "flip-end": len(raw) - 1}[how]
    raw[at] ^= 0x5A
    path.write_bytes(bytes(raw))


def _probe_main(cases_file: str) -> None:
    """Subprocess: probe each case folder, one JSON line per case (a crash stops the lines)."""
    from polyindex.errors import PolyindexError
    for case in json.loads(Path(cases_file).read_text()):
        print(json.dumps({"start": case["name"]}), flush=True)
        try:
            res = {"ok": probe(Path(case["data"]))}
        except PolyindexError as e:
            res = {"error": type(e).__name__, "status": e.status, "message": str(e)}
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
            res = {"error": f"unexpected {type(e).__name__}", "message": str(e)}
        print(json.dumps({"case": case["name"], **res}), flush=True)


def run_probes(cases: list[dict], tmp: Path) -> dict[str, dict]:
    (tmp / "cases.json").write_text(json.dumps(cases))
    proc = subprocess.run([sys.executable, __file__, str(tmp / "cases.json")],
                          capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "POLYINDEX_FAISS_THREADS": "1"})
    results, started = {}, None
    for line in proc.stdout.splitlines():
        rec = json.loads(line)
        if "start" in rec:
            started = rec["start"]
        else:
            results[rec.pop("case")] = rec
    assert proc.returncode == 0, (f"the probe died (rc {proc.returncode}) on case {started}:\n"
                                  f"{proc.stderr[-3000:]}")
    return results


# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def golden(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("golden") / "D"
    build(data)
    return data


def copy_of(golden: Path, where: Path) -> Path:
    shutil.copytree(golden, where)
    return where


def stored_files(folder: Path) -> dict[str, Path]:
    """Every file of the first segment, its tombstones, the artifacts and the manifest."""
    from polyindex.storage.manifest import load_manifest
    m = load_manifest(folder)
    seg = m.segments[0]
    files = {f"segment/{n}": folder / "segments" / seg.id / n for n in seg.files}
    files["tombstones"] = folder / seg.tombstones
    for kind, names in m.artifacts.items():
        for n in names:
            files[f"artifacts/{kind}/{n}"] = folder / "artifacts" / kind / n
    files["manifest.json"] = folder / "manifest.json"
    return files


# ------------------------------------------------------------------ damage

def test_the_manifest_names_and_sums_every_stored_file(golden):
    from polyindex.storage.integrity import sum_file
    from polyindex.storage.manifest import FORMAT_VERSION, load_manifest
    folder = golden / "c"
    m = load_manifest(folder)
    assert m.format_version == FORMAT_VERSION == 2
    assert len(m.segments) == 2 and m.segments[0].tombstones and m.segments[0].n_deleted == 4
    for seg in m.segments:
        on_disk = sorted(p.name for p in (folder / "segments" / seg.id).iterdir())
        assert sorted(seg.files) == on_disk == SEGMENT_FILES
        for name, expect in seg.files.items():
            assert sum_file(folder / "segments" / seg.id / name) == expect
    assert sum_file(folder / m.segments[0].tombstones) == m.segments[0].tombstones_sum
    assert sorted(f"{k}/{n}" for k, files in m.artifact_sums.items() for n in files) \
        == ARTIFACT_FILES
    raw = json.loads((folder / "manifest.json").read_text())
    assert len(raw["checksum"]) == 16


def test_every_damaged_file_is_corrupt_naming_it_never_a_crash(golden, tmp_path):
    cases = [{"name": "pristine", "data": str(copy_of(golden, tmp_path / "pristine"))}]
    targets = {}
    for label in stored_files(golden / "c"):
        for how in DAMAGES:
            name = f"{label}@{how}"
            data = copy_of(golden, tmp_path / f"case{len(cases)}")
            path = stored_files(data / "c")[label]
            damage(path, how)
            cases.append({"name": name, "data": str(data)})
            targets[name] = path
    assert len(targets) == (len(SEGMENT_FILES) + 1 + len(ARTIFACT_FILES) + 1) * len(DAMAGES)
    results = run_probes(cases, tmp_path)
    assert "ok" in results["pristine"], results["pristine"]
    base = results["pristine"]["ok"]
    assert base["count"] == N_FIRST + N_SECOND - 1 - len(DELETED)  # d0 upserted
    assert all(len(q) >= 5 for p in PROFILES for q in base[p])  # every kind finds something
    wrong = []
    for name, path in targets.items():
        res = results[name]
        if res.get("ok") == base:
            continue  # identical results: the damage did not matter
        if res.get("error") == "Corrupt" and res["status"] == "DATA_LOSS" \
                and str(path) in res["message"]:
            continue
        wrong.append(f"{name}: {res if 'ok' not in res else 'different results'}")
    assert not wrong, "damage not reported as Corrupt naming the file:\n" + "\n".join(wrong)
    corrupt = sum(results[n].get("error") == "Corrupt" for n in targets)
    assert corrupt == len(targets)  # with sums, every flip and truncation is caught


def test_format_1_collections_open_and_are_validated(golden, tmp_path):
    """A manifest without sums (format 1) opens with the same results; its Arrow files are
    validated in full, so a truncated one is Corrupt; the next commit writes format 2."""
    from polyindex.storage.manifest import load_manifest
    data = copy_of(golden, tmp_path / "v1")
    path = data / "c" / "manifest.json"
    raw = json.loads(path.read_text())
    raw["format_version"] = 1
    for key in ("checksum", "artifact_sums"):
        raw.pop(key)
    for seg in raw["segments"]:
        seg.pop("files"), seg.pop("tombstones_sum", None)
    path.write_text(json.dumps(raw))
    damaged = {}  # case -> (data folder, damaged file)
    for name in ("docs.arrow", "lexical.postings.arrow", "tree.nodes.arrow", "tombstones"):
        d = copy_of(data, tmp_path / f"v1-{name}")
        rel = raw["segments"][0]["tombstones"] if name == "tombstones" else \
            f"segments/seg-000000/{name}"
        damage(d / "c" / rel, "truncate")
        damaged[name] = (d, d / "c" / rel)
    cases = [{"name": "golden", "data": str(copy_of(golden, tmp_path / "g"))},
             {"name": "v1", "data": str(data)}]
    cases += [{"name": n, "data": str(d)} for n, (d, _) in damaged.items()]
    results = run_probes(cases, tmp_path)
    golden_ok, v1_ok = results["golden"]["ok"], results["v1"]["ok"]
    assert {k: v for k, v in v1_ok.items() if k != "deleted"} == \
        {k: v for k, v in golden_ok.items() if k != "deleted"}
    for name, (_, target) in damaged.items():
        res = results[name]
        assert res.get("error") == "Corrupt" and str(target) in res["message"], (name, res)
    m = load_manifest(data / "c")  # the probe's delete committed: now format 2
    assert m.format_version == 2 and all(s.files is None for s in m.segments)
    assert m.segments[0].tombstones_sum is not None  # the new tombstone file has a sum


def _rewrite(folder: Path, change) -> Path:
    """Edit the manifest's JSON and store it with a valid checksum (only the paths are bad)."""
    from polyindex.storage.manifest import content_checksum
    path = folder / "manifest.json"
    raw = json.loads(path.read_text())
    change(raw)
    raw["checksum"] = content_checksum(raw)
    path.write_text(json.dumps(raw))
    return path


PATH_ATTACKS = {
    "segment-id": lambda m: m["segments"][0].update(id="../../x"),
    "segment-id-abs": lambda m: m["segments"][0].update(id="/tmp/x"),
    "segment-id-shape": lambda m: m["segments"][0].update(id="seg-1/../../x"),
    "tombstones-up": lambda m: m["segments"][0].update(tombstones="tombstones/../../x.arrow"),
    "tombstones-out": lambda m: m["segments"][0].update(tombstones="../x.arrow"),
    "tombstones-deep": lambda m: m["segments"][0].update(tombstones="tombstones/a/b.arrow"),
    "segment-file": lambda m: m["segments"][0]["files"].update(
        {"../../../x": {"size": 1, "xxh3": "0" * 16}}),
    "artifact-kind": lambda m: m["artifacts"].update({"../x": ["f"]}),
    "artifact-file": lambda m: m["artifacts"].update(dense=["../../../../etc/passwd"]),
    "bad-factory": lambda m: m["collection"].update(indexes=["lexical", "dense:Bogus42"]),
}


@pytest.mark.parametrize("attack", sorted(PATH_ATTACKS))
def test_paths_from_a_manifest_stay_inside_the_collection(golden, tmp_path, attack):
    import polyindex
    from polyindex.storage.manifest import load_manifest
    data = copy_of(golden, tmp_path / "D")
    path = _rewrite(data / "c", PATH_ATTACKS[attack])
    with pytest.raises(polyindex.Corrupt) as exc:
        load_manifest(data / "c")
    assert str(path) in str(exc.value)
    with pytest.raises(polyindex.Corrupt):  # not InvalidArgument: the bad string is stored
        polyindex.open(data).collection("c")


def test_verify_lists_every_damaged_file_and_exits_non_zero(golden, tmp_path, cli):
    data = copy_of(golden, tmp_path / "D")
    clean = cli("verify", "--data", data, "--json")
    assert clean.returncode == 0, clean.stderr
    report = json.loads(clean.stdout)
    assert report["ok"] and report["collections"][0]["problems"] == []
    n_files = 2 * len(SEGMENT_FILES) + 1 + len(ARTIFACT_FILES) + 1
    assert report["collections"][0]["files_checked"] == n_files
    files = stored_files(data / "c")
    bad = {files["segment/docs.arrow"]: "flip-middle", files["segment/dense.faiss"]: "flip-end",
           files["tombstones"]: "truncate", files["artifacts/sparse/sparse.projector.npz"]:
           "flip-start"}
    for path, how in bad.items():
        damage(path, how)
    (data / "c" / "wal").mkdir()
    (data / "c" / "wal" / "wal-1.log").write_bytes(b"x" * 10)
    res = cli("verify", "--data", data, "--collection", "c", "--json")
    assert res.returncode == 1, res.stderr
    coll = json.loads(res.stdout)["collections"][0]
    assert sorted(p["file"] for p in coll["problems"]) == sorted(map(str, bad))
    # a lone unreadable frame at the end of the newest file: a torn tail, not damage
    assert coll["wal"] == [{"file": str(data / "c" / "wal" / "wal-1.log"), "size": 10,
                            "unsealed_records": 0, "torn_tail_at": 0}]
    human = cli("verify", "--data", data)
    assert human.returncode == 1
    for path in bad:
        assert str(path) in human.stdout
    damage(data / "c" / "manifest.json", "flip-middle")
    res = cli("verify", "--data", data, "--json")
    assert res.returncode == 1
    assert [p["file"] for p in json.loads(res.stdout)["collections"][0]["problems"]] == \
        [str(data / "c" / "manifest.json")]


# ------------------------------------------------------------------ power-loss order

def _named(folder: Path) -> set[str]:
    from polyindex.storage.manifest import load_manifest
    m = load_manifest(folder)
    out = set()
    for s in m.segments:  # a segment names every file in its folder
        out |= {f"segments/{s.id}/{p.name}" for p in (folder / "segments" / s.id).iterdir()}
        if s.tombstones:
            out.add(s.tombstones)
    for kind, names in m.artifacts.items():
        out |= {f"artifacts/{kind}/{n}" for n in names}
    return out


def _aliases(rel: str) -> list[str]:
    """The names (glob patterns) a path had before a rename put it in place (the writer
    builds ``segments/seg-N`` as ``segments/.seg-N.<pid>.tmp``, a merge as
    ``segments/.merge-<pid>-<n>.tmp``)."""
    parts = rel.split("/")
    if parts[0] == "segments" and len(parts) > 1:
        return [rel, "/".join(["segments", f".{parts[1]}.*.tmp", *parts[2:]]),
                "/".join(["segments", ".merge-*.tmp", *parts[2:]])]
    return [rel]


def check_commit_order(folder: Path, log: list[tuple[str, str]],
                       named_before: set[str]) -> list[str]:
    """Problems with one commit: every file the new manifest names (that the old one did
    not), and every folder new to hold it, must be fsynced, and the folder holding each of
    them fsynced after the entry appeared, before the manifest's rename."""
    ev = [(p, os.path.relpath(path, folder)) for p, path in log]
    renames = [i for i, (p, rel) in enumerate(ev) if p.endswith(".rename") and rel == "manifest.json"]
    assert len(renames) == 1, f"expected one manifest commit, saw {len(renames)}"
    r = renames[0]
    problems = []

    def find(op: str, rel: str, lo: int = -1) -> int | None:
        for i in range(lo + 1, r):
            p, path = ev[i]
            if p.endswith(f".{op}") and any(fnmatch.fnmatchcase(path, a) for a in _aliases(rel)):
                return i
        return None

    def appeared(rel: str) -> int:
        """Log index where the entry ``rel`` was made in its folder (its write, or a rename
        to it); -1 when no logged step made it (a kind wrote it into a temp folder, whose
        fsync before its own rename then covers it)."""
        last = -1
        for i in range(r):
            p, path = ev[i]
            if (p.endswith(".write") or p.endswith(".rename")) and path == rel:
                last = i
        return last

    new_files = sorted(_named(folder) - named_before)
    assert new_files, "the commit names no new file"
    # Folders made durable by earlier commits (or the collection's creation); any other
    # folder above a new file must be fsynced into its parent by this commit.
    established = {".", "segments", "tombstones", "artifacts"} | \
        {str(a) for f in named_before for a in Path(f).parents}
    new_dirs = sorted({str(a) for f in new_files for a in Path(f).parents} - established)
    for rel in new_files:
        if find("fsync", rel) is None:
            problems.append(f"{rel} not fsynced before the manifest rename")
    for rel in new_files + new_dirs:
        parent = str(Path(rel).parent)
        if rel in new_dirs and find("fsync_dir", rel) is None:
            problems.append(f"folder {rel} not fsynced before the manifest rename")
        at = appeared(rel)
        # a file first written in a temp folder: the temp folder's fsync (before its rename)
        # covers the entry; otherwise the parent is fsynced after the entry appeared
        if find("fsync_dir", parent, at) is None:
            problems.append(f"{parent}/ not fsynced after {rel} appeared, before the manifest "
                            "rename")
    if not any(p.endswith(".fsync") and path.startswith(".manifest.json.tmp") for p, path in ev[:r]):
        problems.append("the new manifest is not fsynced before its rename")
    if not any(p.endswith(".fsync_dir") and path == "." for p, path in ev[r:]):
        problems.append("the collection folder is not fsynced after the manifest rename")
    return problems


def test_every_named_file_and_its_folder_is_fsynced_before_the_manifest_rename(tmp_path, corpus):
    import polyindex
    from polyindex.storage import failpoints
    from polyindex.storage.manifest import load_manifest
    eng = polyindex.open(tmp_path / "D")
    bulk = eng.create_collection("b", ["lexical"], segment_size=10_000)
    docs, emb, toks = make_docs(80, seed=8)
    dense = eng.create_collection("v", ["lexical", "dense:IVF4,Flat"])
    corpus.make(tmp_path / "c.jsonl", 300, seed=4)
    extra = dense.table.artifact_dir("extra")
    (extra / "blob.bin").write_bytes(b"artifact bytes")
    steps = {
        "bulk": (bulk, lambda: bulk.index(tmp_path / "c.jsonl")),
        "first segment + trained artifact": (dense, lambda: _commit(dense, docs[:50], emb[:50])),
        "deletes + segment": (dense, lambda: _commit(dense, docs[50:], emb[50:],
                                                     delete_ids=["d1", "d2"])),
        "delete": (dense, lambda: dense.delete(["d3"])),
        "artifact": (dense, lambda: dense.table.commit_metadata(artifacts={"extra": ["blob.bin"]})),
        "merge": (dense, lambda: dense.merge(
            [e.id for e in dense.table.sealed_snapshot().manifest.segments])),
    }
    points = set()
    problems = []
    for name, (coll, step) in steps.items():
        named = _named(coll.folder)
        version = load_manifest(coll.folder).version
        with failpoints.record() as log:
            step()
        assert load_manifest(coll.folder).version == version + 1, name
        problems += [f"{name}: {p}" for p in check_commit_order(coll.folder, log, named)]
        points |= {p.rsplit(".", 1)[0] for p, _ in log}
    assert not problems, "\n".join(problems)
    assert {"commit.segment", "commit.tombstones", "commit.artifacts", "commit.manifest",
            "merge.segment", "merge.manifest"} <= points


def _commit(coll, docs, emb, delete_ids=()):
    with coll.table.writer() as w:
        w.commit_segment(docs, {}, embeddings=emb, delete_ids=delete_ids)
    coll.table.refresh()


if __name__ == "__main__":
    _probe_main(sys.argv[1])
