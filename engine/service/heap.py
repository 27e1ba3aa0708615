"""The serving process's start-up heap, kept out of Python's full garbage collections.

A full collection stops every thread for as long as it walks every tracked object, and
after the imports (numba, llvmlite, pyarrow, faiss, grpc) that is ~180,000 objects: 50-99 ms
a pass, 6-8 passes while 80,000 documents were written in batches of 100, each one a stall
for any query in flight. ``gc.freeze()`` moves what exists once the server is up into the
permanent generation, which collections skip (8-26 ms a pass in the same probe); those
objects are still freed by reference counting. Called by the processes that only serve
(``polyindex serve``, the workers of ``--processes``), not by the library: an embedding
program owns its heap.
"""
from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect once, then freeze what is left; returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
