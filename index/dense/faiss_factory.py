"""A dense field's faiss factory string checked by parsing, never by building.

``faiss.index_factory`` allocates as it parses (``IVF99999999`` asked 13 GB for empty
inverted lists, ``PQ48x16`` 1.5 GB of codebooks), so a string a client sends is read here
first: the supported grammar, each parameter's bounds, and what the index's trained parts
(centroids, codebooks, rotations) and its per-vector storage would take against
``polyindex.config.index_memory_bytes()``. Only a string that passes is ever given to faiss.

Grammar (faiss's own component names, comma-separated, in this order)::

    [OPQ<M>[_<D>] | PCA[W][R]<D> | RR<D> | L2norm]*   preprocessing
    [IVF<n>[_HNSW<M>] | HNSW<M>]                      coarse structure
    Flat | PQ<M>[x<bits>][fs] | SQ4|SQ6|SQ8|SQfp16|SQbf16   codes (HNSW<M> alone: Flat)
    [RFlat | Refine(Flat)]                            exact re-ranking
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from polyindex.errors import InvalidArgument, ResourceExhausted
from polyindex.config import index_memory_bytes
from polyindex.types import MAX_VECTOR_DIMS

MAX_NLIST = 1 << 20  # IVF lists (faiss's guidance tops out at 2^18-2^20 for 1e9 vectors)
MAX_HNSW_M = 256  # graph links per node (hnswlib suggests 2-100)
MAX_PQ_BITS = 16
ASSUMED_DIM = 1024  # the memory check's dimension while the field's is not known yet
_LIST_BYTES = 48  # an empty inverted list (two std::vectors)

_PRE = [(re.compile(r"OPQ(\d+)(?:_(\d+))?"), "OPQ"), (re.compile(r"PCAW?R?(\d+)"), "PCA"),
        (re.compile(r"RR(\d+)"), "RR"), (re.compile(r"L2norm"), "L2norm")]
_COARSE = [(re.compile(r"IVF(\d+)(?:_HNSW(\d+))?"), "IVF"), (re.compile(r"HNSW(\d+)"), "HNSW")]
_CODES = [(re.compile(r"Flat"), "Flat"), (re.compile(r"PQ(\d+)(?:x(\d+))?(fs)?"), "PQ"),
          (re.compile(r"SQ(4|6|8|fp16|bf16)"), "SQ")]
_REFINE = re.compile(r"RFlat|Refine\(Flat\)")
SUPPORTED = ("OPQ<M>[_<D>], PCA<D>, RR<D>, L2norm; then IVF<n>[_HNSW<M>] or HNSW<M>; then "
             "Flat, PQ<M>[x<bits>][fs] or SQ4/SQ6/SQ8/SQfp16/SQbf16; then RFlat")


@dataclass
class Plan:
    """What a checked factory string builds: its components, the dimension its codes see,
    the bytes of its trained parts and the bytes each vector takes."""
    parts: list[str]
    fixed_bytes: int
    vector_bytes: int
    keeps_vectors: bool  # Flat, HNSW..,Flat, IVF..,Flat: the exact vectors are in the index
    nlist: int = 0
    trains: bool = False  # learns something first (faiss's ``is_trained`` of the empty index)


def _fail(where: str, message: str, exhausted: bool = False):
    sep = " " if message.startswith("is ") else ": "
    raise (ResourceExhausted if exhausted else InvalidArgument)(f"{where}{sep}{message}")


def _int(text: str, name: str, lo: int, hi: int, where: str, exhausted: bool = False) -> int:
    value = int(text)
    if not lo <= value <= hi:
        _fail(where, f"{name} must be in {lo}..{hi}, got {value}", exhausted and value > hi)
    return value


def check(body: str, dim: int | None = None, *, where: str = "dense",
          budget: int | None = None) -> Plan:
    """Parse and bound ``body`` for vectors of ``dim`` dimensions (None: not known yet, the
    divisibility checks wait for it and the memory check assumes ``ASSUMED_DIM``)."""
    where = f"{where}: {body!r}"
    parts = [p.strip() for p in body.split(",")]
    d = dim or ASSUMED_DIM
    known = dim is not None  # is d the real dimension (divisibility and upper bounds apply)?
    i, nlist, keeps, trains = 0, 0, True, False
    coarse = None
    budget = index_memory_bytes() if budget is None else budget
    cost = {}  # parameter -> bytes, to name the biggest when over budget

    def match(table):
        for regex, name in table:
            m = regex.fullmatch(parts[i]) if i < len(parts) else None
            if m:
                return name, m
        return None, None

    while True:  # preprocessing
        name, m = match(_PRE)
        if name is None:
            break
        keeps = False
        trains = trains or name != "L2norm"  # rotations and projections are learned
        if name == "OPQ":
            d_out = _int(m.group(2), "OPQ's output dimension D", 1, MAX_VECTOR_DIMS, where) \
                if m.group(2) else d
            known = known or bool(m.group(2))
            M = _int(m.group(1), "OPQ's M (sub-quantizers)", 1,
                     d_out if known else MAX_VECTOR_DIMS, where)
            if known and d_out % M:
                _fail(where, f"OPQ's M={M} must divide its dimension {d_out}")
            cost[f"OPQ{M}"] = d * d_out * 4
            d = d_out
        elif name in ("PCA", "RR"):
            hi = min(d, MAX_VECTOR_DIMS) if name == "PCA" and known else MAX_VECTOR_DIMS
            d_out = _int(m.group(1), f"{name}'s output dimension", 1, hi, where)
            cost[parts[i]] = d * d_out * 4
            d, known = d_out, True
        i += 1
    name, m = match(_COARSE)
    hnsw_m = 0
    if name == "IVF":
        nlist = _int(m.group(1), "IVF's nlist", 1, MAX_NLIST, where, exhausted=True)
        cost[f"IVF{nlist}"] = nlist * (d * 4 + _LIST_BYTES)
        if m.group(2):
            q_m = _int(m.group(2), "IVF's HNSW M", 2, MAX_HNSW_M, where, exhausted=True)
            cost[f"IVF{nlist}_HNSW{q_m}"] = nlist * q_m * 8
        coarse, i, trains = "IVF", i + 1, True
    elif name == "HNSW":
        hnsw_m = _int(m.group(1), "HNSW's M", 2, MAX_HNSW_M, where, exhausted=True)
        coarse, i = "HNSW", i + 1
    name, m = match(_CODES)
    code_bytes = d * 4
    if name is None and coarse == "HNSW" and i == len(parts):
        name = "Flat"  # HNSW32 alone is HNSW32,Flat
    elif name is None:
        got = parts[i] if i < len(parts) else "(nothing)"
        _fail(where, f"is not a valid faiss index factory string: expected codes (Flat, "
              f"PQ<M>, SQ8...) at {got!r}; supported here: {SUPPORTED}")
    else:
        i += 1
    if name == "PQ":
        M = _int(m.group(1), "PQ's M (sub-quantizers)", 1, d if known else MAX_VECTOR_DIMS,
                 where)
        fast = bool(m.group(3))
        bits = _int(m.group(2), "PQ's bits", 1, MAX_PQ_BITS, where, exhausted=True) \
            if m.group(2) else 4 if fast else 8
        if fast and bits != 4:
            _fail(where, f"fast-scan PQ (fs) uses 4 bits per code, got {bits}")
        if fast and coarse == "HNSW":
            _fail(where, "is not a valid faiss index factory string: fast-scan PQ (fs) does "
                  "not combine with HNSW<M> (use PQ<M> or IVF<n>,PQ<M>x4fs)")
        if known and d % M:
            _fail(where, f"PQ's M={M} must divide the dimension {d}")
        cost[parts[i - 1]] = d * (1 << bits) * 4
        code_bytes = (M * bits + 7) // 8
        trains = True  # codebooks are learned
        keeps = False
    elif name == "SQ":
        code_bytes = {"4": d // 2 + 1, "6": (d * 6 + 7) // 8, "8": d}.get(m.group(1), d * 2)
        keeps = False
        trains = trains or m.group(1) in ("4", "6", "8")  # ranges are learned; fp16 is not
    if i < len(parts) and _REFINE.fullmatch(parts[i]):
        code_bytes += d * 4
        keeps, i = False, i + 1
    if i < len(parts):
        _fail(where, f"is not a valid faiss index factory string: unsupported component "
              f"{parts[i]!r}; supported here: {SUPPORTED}")
    fixed = sum(cost.values())
    if fixed > budget:
        worst = max(cost, key=cost.get)
        _fail(where, f"{worst} would take {cost[worst] / 2**20:,.0f} MB at dimension {d} "
              f"(the index memory budget is {budget / 2**20:,.0f} MB, POLYINDEX_INDEX_MEMORY_MB)",
              exhausted=True)
    vector_bytes = code_bytes + 8 + (hnsw_m * 2 * 4 * 2 if coarse == "HNSW" else 0)
    return Plan(parts, fixed, vector_bytes, keeps, nlist, trains)


def check_rows(plan: Plan, rows: int, where: str, budget: int | None = None) -> None:
    """An index over ``rows`` vectors within the budget. (Too few rows to train IVF's lists
    is no error: such a segment is built exact and a later batch trains, ``dense._trains``.)"""
    budget = index_memory_bytes() if budget is None else budget
    if plan.fixed_bytes + plan.vector_bytes * rows > budget:
        _fail(where, f"an index of {rows:,} vectors would take "
              f"{(plan.fixed_bytes + plan.vector_bytes * rows) / 2**20:,.0f} MB (the index "
              f"memory budget is {budget / 2**20:,.0f} MB, POLYINDEX_INDEX_MEMORY_MB)", True)
