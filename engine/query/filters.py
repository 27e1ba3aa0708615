"""Metadata filters: a small JSON language compiled to a pyarrow expression per query.

``{"year": {"gte": 1990}, "lang": "en"}`` (fields AND-ed), operators eq, ne, gt, gte, lt, lte,
in, nin, and combinators ``{"and": [...]}``, ``{"or": [...]}``, ``{"not": {...}}``. The result
is evaluated per segment into the boolean allow-mask every retrieve stage applies.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from polyindex.errors import InvalidArgument

OPS = {"eq": "__eq__", "ne": "__ne__", "gt": "__gt__", "gte": "__ge__", "lt": "__lt__",
       "lte": "__le__"}


def compile_filter(spec: dict, fields: dict[str, str]) -> pc.Expression:
    if not isinstance(spec, dict) or not spec:
        raise InvalidArgument(f"filter must be a non-empty JSON object, got {spec!r}")
    parts = []
    for key, value in spec.items():
        if key in ("and", "or"):
            if not isinstance(value, list) or not value:
                raise InvalidArgument(f"filter {key!r} needs a non-empty list")
            subs = [compile_filter(v, fields) for v in value]
            expr = subs[0]
            for s in subs[1:]:
                expr = (expr & s) if key == "and" else (expr | s)
            parts.append(expr)
        elif key == "not":
            parts.append(~compile_filter(value, fields))
        else:
            parts.append(_field_expr(key, value, fields))
    expr = parts[0]
    for p in parts[1:]:
        expr = expr & p
    return expr


def _field_expr(name: str, cond, fields: dict[str, str]) -> pc.Expression:
    if name != "id" and name not in fields:
        raise InvalidArgument(f"filter names field {name!r}, which is not a declared field "
                              f"(declared: {sorted(fields) or 'none'}; 'id' always works)")
    col = pc.field(name)
    ftype = "string" if name == "id" else fields[name]
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
                raise InvalidArgument(f"filter on {name!r}: {op!r} needs a scalar value")
            _check_value(name, ftype, op, value)
            exprs.append(getattr(col, OPS[op])(value))
        else:
            raise InvalidArgument(f"filter on {name!r}: unknown operator {op!r} "
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
    try:
        # Project the expression as a column: one pass, no copy of the table's rows.
        mask = ds.dataset(table).to_table(columns={"m": expr}).column("m")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise InvalidArgument(f"filter cannot be applied: {e}") from None
    return pc.fill_null(mask, False).to_numpy(zero_copy_only=False).astype(bool, copy=False)
