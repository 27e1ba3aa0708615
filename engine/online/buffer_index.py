"""The buffer indexer: an HNSW graph over an online buffer's dense rows, grown off the write
path (``index.dense.stack``).

In a collection past ``dense.AUTO_HNSW_ROWS`` (where the dense ``auto`` rule gives segments
a graph), a write that leaves ``STEP_ROWS`` or more of the active buffer's rows (from
``FIRST_ROWS`` on) outside its graph wakes this thread. It adds those rows to its own
graph (faiss releases the GIL; one OpenMP thread, at nice +10 like the build process, so
queries keep the CPU) and publishes a copy with a new snapshot; a query searches the graph
for those rows and scans only the rest exactly. Nothing here is durable or needed: a failure
is logged and the rows stay exactly scanned.
"""
from __future__ import annotations

import logging
import os
import threading

from polyindex.index.dense.stack import build_graph

# A graph from 1,000 buffered rows, grown every 500 (~30 ms of adding, a copy of a few ms):
# a 5,000-row exact scan cost 0.56 ms a query in a living probe, the graph and its rest 0.39
FIRST_ROWS = 1_000
STEP_ROWS = 500
NICE = 10
log = logging.getLogger("polyindex.online")


class BufferIndexer:
    def __init__(self, view):
        self.view = view
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def poke(self) -> None:
        """After a write: grow the graph if the buffer asks for it (cheap when it does not)."""
        if self._stop.is_set() or self.view.graph_job(peek=True) is None:
            return
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"buffer-index-{self.view.table.name}")
                self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        with self._start_lock:
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        try:  # this thread only (Linux: a thread id is a process id for setpriority)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        except (AttributeError, OSError):
            pass
        import faiss  # here: a buffer without dense rows never loads it (issue 38)
        faiss.omp_set_num_threads(1)  # a per-thread setting
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            while not self._stop.is_set():
                job = self.view.graph_job()
                if job is None:
                    break
                stack, matrix, upto = job
                try:
                    graph = build_graph(stack, matrix, upto)
                except Exception as e:  # noqa: BLE001 - the rows stay exactly scanned
                    log.warning("%s: indexing the write buffer failed: %s",
                                self.view.table.name, e)
                    stack.broken_graph = True
                    break
                self.view.publish_graph(stack, graph, upto)


def wanted(view, stack, base_rows: int) -> bool:
    """Does this buffer's stack want its graph grown now?"""
    if not view.graph_auto or stack.broken or stack.broken_graph:
        return False
    if stack.rows < FIRST_ROWS or stack.rows - stack.indexed < STEP_ROWS:
        return False
    from polyindex.index.dense import kind as dense
    return base_rows + stack.rows >= dense.AUTO_HNSW_ROWS
