"""``polyindex index --ray``: bulk ingestion over Ray, committed by this process (the driver).

The driver holds the collection's writer (its lock, the manifest) and cuts the source into
ranges of ``segment_size`` records by position, from where the manifest says the last run
stopped (the bulk path's resume state, so either path resumes the other's run). Ray Data
maps the ranges (one row each: a task, not documents) over an actor pool of N encoders
(``distributed.build.SegmentBuilder``: the model loaded once per actor, ``num_gpus`` when
asked); each reads its range, encodes and builds a whole segment folder inside the data
directory, and answers a descriptor. The driver commits the folders in source order, each
with the position after its range, so a crash leaves a prefix committed and a rerun starts
after it; no row ever reaches the driver.

When a kind needs collection-wide training (multivector codebook, sparse projector, tree,
a trained dense index), the first range runs alone and its worker trains on it, as bulk
trains on its first segment; its artifacts commit with that segment and the pool that
builds the rest loads them.
"""
from __future__ import annotations

import pickle
import shutil

from polyindex.distributed import cluster
from polyindex.distributed.build import TMP_PREFIX, SegmentBuilder
from polyindex.errors import InvalidArgument
from polyindex.ingest.bulk import IngestReport, resume_point
from polyindex.ingest.progress import progress_bar


def plan_ranges(start: int, total: int | None, size: int) -> list[tuple[int, int | None]]:
    """[start, stop) ranges of ``size`` records; the last one open-ended, so a count that
    came out low (a format that can only estimate) never loses a record."""
    if size < 1:
        raise InvalidArgument(f"segment size must be >= 1, got {size}")
    bounds = list(range(start, max(total or 0, start + 1), size))
    return [(b, bounds[i + 1] if i + 1 < len(bounds) else None) for i, b in enumerate(bounds)]


def count_records(source, start: int) -> int:
    """The source's record count, or an upper bound (lines): exact for Parquet, cheap for
    files whose lines can be counted; an Arrow stream or a big .gz is read once."""
    total = source.estimate_total()
    if total is not None:
        return total
    end = start
    for pos, _ in source.records(start):
        end = pos + 1
    return end


class _Commits:
    """Commits built folders in range order (workers finish in any order)."""

    def __init__(self, writer, fingerprint: dict, report: IngestReport, position: int, advance):
        self.w, self.fingerprint, self.report = writer, fingerprint, report
        self.position, self.advance = position, advance
        self.pending: dict[int, dict] = {}
        self.next = 0

    def state(self, done: bool) -> dict:
        return {"source": self.fingerprint, "position": self.position, "done": done,
                "skipped_invalid": self.report.skipped_invalid}

    def take(self, desc: dict) -> None:
        self.pending[desc["index"]] = desc
        while self.next in self.pending:
            d = self.pending.pop(self.next)
            self.next += 1
            if "error" in d:
                raise pickle.loads(d["error"])  # what came before it stays committed
            self.report.skipped_invalid += d["skipped"]
            self.advance(d["position"] - self.position)
            self.position = d["position"]
            if d["folder"] is None:
                continue  # nothing but invalid records or blank lines: the next commit says so
            self.w.commit_built(self.w.folder / "segments" / d["folder"], d["n_rows"],
                                d["infos"], ingest=self.state(False), artifacts=d["artifacts"])
            self.report.indexed += d["n_rows"]
            self.report.segments += 1

    def finish(self, fields: dict) -> None:
        self.w.commit_segment([], fields, ingest=self.state(True))


def _cpus_per_encoder(ray, encoders: int) -> int:
    """Each actor's share of the CPUs (Ray sets its torch threads to it), no more than the
    smallest node has, so every actor can be placed."""
    nodes = [n["Resources"].get("CPU", 1) for n in ray.nodes() if n.get("Alive")] or [1]
    return int(max(1, min(min(nodes), sum(nodes) // encoders)))


def _check_gpus(ray, encoders: int, gpus: float) -> None:
    have = ray.cluster_resources().get("GPU", 0)
    if gpus and have < gpus * encoders:
        # Ray Data would wait for them forever
        raise InvalidArgument(f"--encoders {encoders} --gpus-per-encoder {gpus:g} needs "
                              f"{gpus * encoders:g} GPUs; the Ray cluster has {have:g}")


def _run(ray, folder, source, tasks: list[dict], encoders: int, gpus: float, progress: bool):
    """The descriptors of ``tasks``, as the actor pool finishes them."""
    import ray.data
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = progress
    cpus = _cpus_per_encoder(ray, encoders)
    # One block per range, so ranges spread over the actors instead of queueing on one
    ds = ray.data.from_items([{"task": pickle.dumps(t)} for t in tasks],
                             override_num_blocks=len(tasks))
    pool = ray.data.ActorPoolStrategy(size=min(encoders, len(tasks)))
    ds = ds.map_batches(SegmentBuilder, batch_size=1, batch_format="numpy", compute=pool,
                        num_cpus=cpus,
                        num_gpus=gpus or None,
                        fn_constructor_kwargs={"folder": str(folder), "source": source,
                                               "device": "cuda" if gpus else "cpu"})
    for batch in ds.iter_batches(batch_size=1, batch_format="numpy", prefetch_batches=0):
        for raw in batch["out"]:
            yield pickle.loads(raw)


def ray_index(collection, source, *, encoders: int = 1, gpus_per_encoder: float = 0,
              address: str | None = None, skip_invalid: bool = False, force: bool = False,
              progress: bool = True) -> IngestReport:
    """Index ``source`` into ``collection`` over Ray (joined at ``address`` or started
    locally, loopback only); the same collection a bulk ``index`` builds, resumable."""
    if encoders < 1:
        raise InvalidArgument(f"--encoders must be >= 1, got {encoders}")
    if gpus_per_encoder < 0:
        raise InvalidArgument(f"--gpus-per-encoder must be >= 0, got {gpus_per_encoder}")
    ray = cluster.start(address)
    _check_gpus(ray, encoders, gpus_per_encoder)
    report = IngestReport()
    fingerprint = source.fingerprint()
    with collection.table.writer() as w:
        start = resume_point(w.manifest, fingerprint, force, report)
        if start is None:
            return report
        size = collection.config.segment_size
        total = count_records(source, start)
        live = sum(e.n_rows - e.n_deleted for e in w.manifest.segments)
        tasks = [{"index": i, "start": a, "stop": b, "fingerprint": fingerprint,
                  "skip_invalid": skip_invalid, "train": False,
                  "collection_rows": live + a - start}  # as bulk's, with no duplicates
                 for i, (a, b) in enumerate(plan_ranges(start, total, size))]
        train = any(k.needs_training() for k in w.kinds.values())
        bar = progress_bar(f"indexing {source.path.name} on Ray", None if total is None
                           else total - start, enabled=progress)
        with bar as advance:
            commits = _Commits(w, fingerprint, report, start, advance)
            try:
                while train and tasks:  # one range alone until one had documents to train on
                    first = dict(tasks.pop(0), train=True)
                    for desc in _run(ray, w.folder, source, [first], 1, gpus_per_encoder,
                                     progress):
                        commits.take(desc)
                    train = desc.get("n_rows", 0) == 0
                if tasks:
                    for desc in _run(ray, w.folder, source, tasks, encoders, gpus_per_encoder,
                                     progress):
                        commits.take(desc)
                commits.finish(collection.config.fields)
            finally:
                _remove_uncommitted(w.folder)
    collection.table.refresh()
    return report


def _remove_uncommitted(folder) -> None:
    """Built folders not committed (an error stopped the run): the next writer would remove
    them too; an actor still writing one may leave a part, which it removes then."""
    for entry in (folder / "segments").glob(f"{TMP_PREFIX}*"):
        shutil.rmtree(entry, ignore_errors=True)

