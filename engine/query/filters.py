"""Metadata filters: a small JSON language compiled to a pyarrow expression per query.

``{"year": {"gte": 1990}, "lang": "en"}`` (fields AND-ed), operators eq, ne, gt, gte, lt, lte,
in, nin, and combinators ``{"and": [...]}``, ``{"or": [...]}``, ``{"not": {...}}``. The result
is evaluated per segment into the boolean allow-mask every retrieve stage applies.

Cost (issue 17 part 4): a query pays for a filter once per (segment, live mask, filter), not
once per query. ``compile_filter`` memoizes by the canonical spec (so the same filter is the
same expression object, with its normalized key and a range plan); ``allow_mask`` first asks
the plan whether the segment's column statistics (min/max/nulls of declared int and float
fields, computed once per opened segment) already decide it (no row can match: an all-False
mask, not evaluated; every row matches: the live mask itself), else evaluates it and keeps
``mask & live`` in a bounded LRU (``MASK_CACHE_ENTRIES`` entries, ``MASK_CACHE_BYTES``)
keyed by the identity of the segment and the live mask (immutable objects, held weakly) and
the normalized filter. Cached masks are read-only.
"""
from __future__ import annotations

import json
import pickle
import threading
from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from polyindex.config import settings
from polyindex.errors import InvalidArgument, did_you_mean
from polyindex.index.masks import IdentityLRU, freeze, nothing

MASK_CACHE_BYTES = settings().filter_cache_mb << 20
MASK_CACHE_ENTRIES = 16_384
COMPILED_ENTRIES = 256
# what allow_mask did, for tests and benchmarks: evaluated (a pass over the segment's rows),
# cached (an LRU hit), none / all (decided by column statistics, not evaluated)
counters = {"evaluated": 0, "cached": 0, "none": 0, "all": 0}

OPS = {"eq": "__eq__", "ne": "__ne__", "gt": "__gt__", "gte": "__ge__", "lt": "__lt__",
       "lte": "__le__"}


def compile_filter(spec: dict, fields: dict[str, str]) -> pc.Expression:
    """The filter as a pyarrow expression; the same spec (and fields) gives the same object."""
    try:
        key = json.dumps(spec, sort_keys=True, separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError):
        key = None  # not JSON (the checks below say why): compiled without memo
    memo = None if key is None else (key, json.dumps(sorted(fields.items())))
    if memo is not None:
        with _compiled_lock:
            hit = _compiled.get(memo)
            if hit is not None:
                _compiled.move_to_end(memo)
                return hit
    expr = _compile(spec, fields)
    if memo is not None:
        _info.put((expr,), (key, _plan(spec, fields)))
        with _compiled_lock:
            _compiled[memo] = expr
            while len(_compiled) > COMPILED_ENTRIES:
                _compiled.popitem(last=False)
    return expr


def _compile(spec: dict, fields: dict[str, str]) -> pc.Expression:
    if not isinstance(spec, dict) or not spec:
        raise InvalidArgument(f"filter must be a non-empty JSON object, got {spec!r}")
    parts = []
    for key, value in spec.items():
        if key in ("and", "or"):
            if not isinstance(value, list) or not value:
                raise InvalidArgument(f"filter {key!r} needs a non-empty list")
            subs = [_compile(v, fields) for v in value]
            expr = subs[0]
            for s in subs[1:]:
                expr = (expr & s) if key == "and" else (expr | s)
            parts.append(expr)
        elif key == "not":
            parts.append(~_compile(value, fields))
        else:
            parts.append(_field_expr(key, value, fields))
    expr = parts[0]
    for p in parts[1:]:
        expr = expr & p
    return expr


def _field_expr(name: str, cond, fields: dict[str, str]) -> pc.Expression:
    if name != "id" and name not in fields:
        raise InvalidArgument(f"filter names field {name!r}, which is not a declared field"
                              f"{did_you_mean(name, [*fields, 'id', 'and', 'or', 'not'])} "
                              f"(declared: {sorted(fields) or 'none'}; 'id' always works)")
    col = pc.field(name)
    ftype = "string" if name == "id" else fields[name]
    if isinstance(cond, list):  # {"year": [1990, 1991]}: meant as "any of these"
        raise InvalidArgument(f"filter on {name!r}: a list is not a value; to match any of "
                              f"several, use in: {{{json.dumps(name)}: {{\"in\": "
                              f"{json.dumps(cond)[:200]}}}}}")
    if not isinstance(cond, dict):
        cond = {"eq": cond}
    exprs = []
    for op, value in cond.items():
        if op in ("in", "nin"):
            if not isinstance(value, list):
                raise InvalidArgument(f"filter on {name!r}: {op!r} needs a list")
            for v in value:
                _check_value(name, ftype, op, v)
            e = col.isin(value)
            exprs.append(~e if op == "nin" else e)
        elif op in OPS:
            if isinstance(value, (list, dict)) or value is None:
                hint = {"eq": " (to match any of several values: in)",
                        "ne": " (to exclude several values: nin)"}.get(op, "") \
                    if isinstance(value, list) else ""
                raise InvalidArgument(f"filter on {name!r}: {op!r} needs a scalar value{hint}")
            _check_value(name, ftype, op, value)
            exprs.append(getattr(col, OPS[op])(value))
        else:
            raise InvalidArgument(f"filter on {name!r}: unknown operator {op!r}"
                                  f"{did_you_mean(op, [*OPS, 'in', 'nin'])} "
                                  f"(known: {sorted([*OPS, 'in', 'nin'])})")
    expr = exprs[0]
    for e in exprs[1:]:
        expr = expr & e
    return expr


_WANT = {"string": ((str,), "a string"), "int": ((int,), "an integer"),
         "float": ((int, float), "a number"), "bool": ((bool,), "true or false")}


def _check_value(name: str, ftype: str, op: str, value) -> None:
    """A value must suit the field's declared type; Arrow's own message for a mismatch names
    compute kernels, not the field (bool is an int to Python, never to a filter)."""
    ok, want = _WANT[ftype]
    if not isinstance(value, ok) or (ftype != "bool" and isinstance(value, bool)):
        raise InvalidArgument(f"filter on {name!r}: {op!r} needs {want} ({name!r} is declared "
                              f"{ftype}), got {type(value).__name__} {value!r}"[:300])


def evaluate(expr: pc.Expression, table: pa.Table) -> np.ndarray:
    """Boolean allow-mask over the table's rows (a null comparison counts as not allowed)."""
    # imported at the first filter: pyarrow.dataset loads pandas (~0.16 s of a cold CLI call)
    import pyarrow.dataset as ds
    try:
        # Project the expression as a column: one pass, no copy of the table's rows.
        mask = ds.dataset(table).to_table(columns={"m": expr}).column("m")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise InvalidArgument(f"filter cannot be applied: {e}") from None
    return pc.fill_null(mask, False).to_numpy(zero_copy_only=False).astype(bool, copy=False)


# --------------------------------------------------------------------------- caching

_compiled: "OrderedDict[tuple, pc.Expression]" = OrderedDict()
_compiled_lock = threading.Lock()
_info = IdentityLRU(4 * COMPILED_ENTRIES)           # expression -> (key, plan or None)
_stats = IdentityLRU(1 << 16)                        # segment docs -> _SegmentStats
_masks = IdentityLRU(MASK_CACHE_ENTRIES, MASK_CACHE_BYTES,
                     size=lambda m: getattr(m, "nbytes", 0))


def clear_caches() -> None:
    """Forget cached masks, column statistics and compiled filters (tests, benchmarks)."""
    _masks.clear()
    _stats.clear()
    _info.clear()
    with _compiled_lock:
        _compiled.clear()


def _key_of(expr: pc.Expression) -> tuple[object, object]:
    """(normalized key, range plan or None) of an expression."""
    got = _info.get((expr,))
    if got is None:  # not made by compile_filter: keyed by its full serialization
        got = (pickle.dumps(expr), None)
        _info.put((expr,), got)
    return got


_EVERY = object()  # cached "no mask": every row of the segment passes


def allow_mask(docs, live: np.ndarray | None, expr: pc.Expression) -> np.ndarray | None:
    """Rows of a segment (``docs``: its ``Segment``, ``docs.table`` its rows) that are live
    and pass the filter: a read-only bool array, or None (every row). Equal to
    ``evaluate(expr, docs.table) & live``."""
    key, plan = _key_of(expr)
    hit = _masks.get((docs, live), key)
    if hit is not None:
        counters["cached"] += 1
        return None if hit is _EVERY else hit
    verdict = None
    if plan is not None:
        verdict = plan(_segment_stats(docs))
    if verdict == "none":
        counters["none"] += 1
        mask = _segment_stats(docs).nothing()
    elif verdict == "all":
        counters["all"] += 1
        mask = live
    else:
        counters["evaluated"] += 1
        m = evaluate(expr, docs.table)
        mask = m if live is None else (m & live)
        freeze(mask)
    _masks.put((docs, live), _EVERY if mask is None else mask, key)
    return mask


class _SegmentStats:
    """min, max and null count of a segment's declared numeric columns, computed on first use
    (once per opened segment); None for a column whose values cannot be bounded (NaN)."""

    def __init__(self, table: pa.Table):
        self.table = table
        self.n_rows = table.num_rows
        self._cols: dict[str, tuple | None] = {}
        self._nothing: np.ndarray | None = None
        self._lock = threading.Lock()

    def column(self, name: str):
        if name not in self._cols:
            self._cols[name] = self._compute(name)
        return self._cols[name]

    def _compute(self, name: str):
        if name not in self.table.column_names:
            return None
        col = self.table.column(name)
        typ = col.type
        if not (pa.types.is_integer(typ) or pa.types.is_floating(typ)):
            return None
        if pa.types.is_floating(typ) and pc.any(pc.is_nan(col)).as_py():
            return None  # NaN compares unlike any bound: no verdict from a range
        mm = pc.min_max(col)
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        return lo, hi, col.null_count, pa.types.is_floating(typ)

    def nothing(self) -> np.ndarray:
        if self._nothing is None:
            self._nothing = nothing(self.n_rows)
        return self._nothing


def _segment_stats(docs) -> _SegmentStats:
    st = _stats.get((docs,))
    if st is None:
        st = _SegmentStats(docs.table)
        _stats.put((docs,), st)
    return st


# A plan maps a segment's statistics to "all" (every row passes), "none" (no row passes) or
# None (evaluate). Internally each node gives (always_true, never_true, always_false) over the
# rows, Kleene logic as Arrow's (null & false = false, null | true = true, a null result is
# not allowed): always_false means false and never null.
_UNKNOWN = (False, False, False)


def _plan(spec: dict, fields: dict[str, str]):
    node = _node(spec, fields)
    if node is None:
        return None

    def plan(stats: _SegmentStats):
        t, n, _ = node(stats)
        return "all" if t else ("none" if n else None)
    return plan


def _node(spec, fields):
    parts = []
    for key, value in spec.items():
        if key in ("and", "or"):
            subs = [_node(v, fields) for v in value]
            parts.append(_combine(subs, key == "and"))
        elif key == "not":
            sub = _node(value, fields)
            parts.append(None if sub is None else _negate(sub))
        else:
            parts.append(_leaf(key, value, fields))
    return _combine(parts, True)


def _combine(subs, conj: bool):
    if all(s is None for s in subs):
        return None
    subs = [s if s is not None else (lambda st: _UNKNOWN) for s in subs]

    def node(st):
        rs = [s(st) for s in subs]
        if conj:
            return (all(r[0] for r in rs), any(r[1] for r in rs), any(r[2] for r in rs))
        return (any(r[0] for r in rs), all(r[1] for r in rs), all(r[2] for r in rs))
    return node


def _negate(sub):
    def node(st):
        t, _, f = sub(st)
        return (f, t, t)  # not(always true) is always false; not(always false) always true
    return node


_TESTS = {
    # op: (every value in [lo, hi] passes, no value in [lo, hi] passes)
    "eq": lambda lo, hi, v: (lo == hi == v, v < lo or v > hi),
    "ne": lambda lo, hi, v: (v < lo or v > hi, lo == hi == v),
    "gt": lambda lo, hi, v: (lo > v, hi <= v),
    "gte": lambda lo, hi, v: (lo >= v, hi < v),
    "lt": lambda lo, hi, v: (hi < v, lo >= v),
    "lte": lambda lo, hi, v: (hi <= v, lo > v),
    "in": lambda lo, hi, vs: (lo == hi and lo in vs, all(v < lo or v > hi for v in vs)),
    "nin": lambda lo, hi, vs: (all(v < lo or v > hi for v in vs), lo == hi and lo in vs),
}


def _leaf(name: str, cond, fields):
    if fields.get(name) not in ("int", "float") or name == "id":
        return None
    if not isinstance(cond, dict):
        cond = {"eq": cond}
    ops = [(op, v) for op, v in cond.items() if op in _TESTS]
    if len(ops) != len(cond):
        return None
    if fields[name] == "int" and any(not -2**63 <= x < 2**63 for _, v in ops
                                     for x in (v if isinstance(v, list) else [v])):
        return None  # Arrow rejects the value: evaluation says so, not the plan

    def node(st: _SegmentStats):
        col = st.column(name)
        if col is None:
            return _UNKNOWN
        lo, hi, nulls, is_float = col
        out = []
        for op, v in ops:
            # a null row: null for a comparison (not allowed), false for in, true for nin
            # (Arrow's is_in without a null in the value set)
            if lo is None:  # every value null (or no rows)
                empty = st.n_rows == 0
                out.append((True, empty, empty) if op == "nin" else
                           (empty, True, empty if op != "in" else True))
                continue
            if is_float:
                v = [float(x) for x in v] if op in ("in", "nin") else float(v)
            passes, fails = _TESTS[op](lo, hi, v)
            if op == "in":
                out.append((passes and nulls == 0, fails, fails))
            elif op == "nin":
                out.append((passes, fails and nulls == 0, fails and nulls == 0))
            else:
                out.append((passes and nulls == 0, fails, fails and nulls == 0))
        # the ops are AND-ed (Kleene)
        return (all(r[0] for r in out), any(r[1] for r in out), any(r[2] for r in out))
    return node
