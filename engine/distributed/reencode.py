"""``polyindex adapt --ray``: the re-encoding of an adapt on Ray encoder actors, one segment
per task, as ``index --ray`` builds one source range per task (``distributed.ingest``).

Each actor opens the collection's storage read-only (its kinds and committed artifacts), loads the
target encoder once and rebuilds the segments it is given with ``storage.reencode.rebuild``
into the adapt's work folder (storage every node sees, like the data directory): the same
files, fsynced and listed, a local rebuild writes, so the driver's commit
(``storage.reencode.commit``, under the writer) finds them as it finds its own, and an
interrupted run resumes from them. Only small descriptors cross back to the driver.
"""
from __future__ import annotations

import pickle
from pathlib import Path

from polyindex.distributed import cluster
from polyindex.distributed.cluster import error_bytes
from polyindex.errors import InvalidArgument


class SegmentReencoder:
    """The Ray Data actor: one model load, then rebuilds (``task``: pickled dicts in,
    ``out``: pickled descriptors or an ``error`` out)."""

    def __init__(self, folder: str, current: tuple, work: str, device: str = "cpu"):
        from polyindex.ingest.encoding import Encoding, token_encoder
        from polyindex.storage.table import Table
        # the collection's storage read-only (its kinds, config and committed artifacts):
        # the driver holds the writer
        self.table = t = Table(Path(folder), readonly=True, token_encoder=token_encoder)
        enc = Encoding(t.name, t.config.model, t.config.dtype, device, t.kinds)
        self.spec = enc.vector_spec().fields
        enc.follow(tuple(current))
        _ = enc.encoder  # the model loads here, once per actor
        self.encode = enc.document_encoder(device)
        self.work = Path(work)

    def __call__(self, batch: dict) -> dict:
        import numpy as np
        from polyindex.storage import reencode
        from polyindex.storage.snapshot import OpenedSegment
        outs = []
        for raw in batch["task"]:
            task = pickle.loads(raw)
            entry = task["entry"]
            try:
                seg = OpenedSegment(self.table.folder / "segments" / entry.id, entry,
                                    self.table.kinds)
                reencode.rebuild(self.work, seg, self.table.kinds, self.spec, self.encode,
                                 task["collection_rows"])
                desc = {"segment": entry.id, "rows": entry.n_rows}
            except Exception as e:  # noqa: BLE001 - sent to the driver, raised there
                desc = {"segment": entry.id, "error": error_bytes(e)}
            outs.append(pickle.dumps(desc))
        return {"out": np.array(outs, dtype=object)}


def rebuild_on_ray(folder: Path, snap, work: Path, current: tuple, *, encoders: int = 1,
                   address: str | None = None, device: str = "cpu", progress=None) -> int:
    """Rebuild the segments of ``snap`` not yet rebuilt under ``work`` on ``encoders`` Ray
    actors; returns the rows encoded. ``progress(rows done, rows in all)``."""
    from polyindex.storage import reencode
    if encoders < 1:
        raise InvalidArgument(f"--encoders must be >= 1, got {encoders}")
    ray = cluster.start(address)
    import ray.data
    live = snap.manifest.live_rows()
    total = sum(e.n_rows for e in snap.manifest.segments)
    tasks = [{"entry": e, "collection_rows": live - (e.n_rows - e.n_deleted)}
             for e in snap.manifest.segments if reencode.rebuilt(work, e.id) is None]
    done = total - sum(t["entry"].n_rows for t in tasks)
    if not tasks:
        return 0
    ray.data.DataContext.get_current().enable_progress_bars = False
    ds = ray.data.from_items([{"task": pickle.dumps(t)} for t in tasks],
                             override_num_blocks=len(tasks))
    ds = ds.map_batches(SegmentReencoder, batch_size=1, batch_format="numpy",
                        compute=ray.data.ActorPoolStrategy(size=min(encoders, len(tasks))),
                        num_gpus=1 if device == "cuda" else None,
                        fn_constructor_kwargs={"folder": str(folder), "current": current,
                                               "work": str(work), "device": device})
    encoded = 0
    for batch in ds.iter_batches(batch_size=1, batch_format="numpy", prefetch_batches=0):
        for raw in batch["out"]:
            desc = pickle.loads(raw)
            if "error" in desc:
                raise pickle.loads(desc["error"])
            encoded += desc["rows"]
            done += desc["rows"]
            if progress is not None:
                progress(done, total)
    return encoded
