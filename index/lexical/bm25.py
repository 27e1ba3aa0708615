"""BM25 variants of the lexical index: their idf, term-frequency part and parameters.

The variants are those of Kamphuis et al. (ECIR 2020, "Which BM25 do you mean?") as bm25s
implements them; ``tf`` is the term's count in the document, ``dl`` its length, ``L`` =
``1 - b + b * dl / avgdl``:

============  ===================================  =============================================
variant       idf                                  term-frequency part
============  ===================================  =============================================
``bm25``      ``log(1 + (N - df + .5)/(df + .5))``  ``tf (k1 + 1) / (tf + k1 L)`` (the default)
``lucene``    ``log(1 + (N - df + .5)/(df + .5))``  ``tf / (tf + k1 L)``
``robertson`` ``log(max(1, (N - df + .5)/(df + .5)))`` ``tf / (tf + k1 L)``
``atire``     ``log(N / df)``                       ``tf (k1 + 1) / (tf + k1 L)``
``bm25l``     ``log((N + 1) / (df + .5))``          ``(k1 + 1)(c + delta) / (k1 + c + delta)``, ``c = tf / L``
``bm25+``     ``log((N + 1) / df)``                 ``tf (k1 + 1) / (tf + k1 L) + delta``
============  ===================================  =============================================

``bm25`` (polyindex's default since the start) ranks exactly as ``lucene``; its scores are
``k1 + 1`` times larger (kept so scores of existing collections do not change). For
``bm25l`` and ``bm25+`` a query term the document lacks still scores ``idf x tfc(0)``; as in
bm25s that constant is added for every query term, so scores equal bm25s's (rows that match
no query term are not retrieved: they would all tie at the constant).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

import numba
import numpy as np
from numba.extending import overload

from polyindex.errors import InvalidArgument
from polyindex.index.docids import block_of, row_in_block
from polyindex.index.postings import _select, score_rows, scorer_of, term_score

VARIANTS = ("bm25", "lucene", "robertson", "atire", "bm25l", "bm25+")
ALIASES = {"bm25plus": "bm25+", "bm25-plus": "bm25+", "bm25-l": "bm25l"}
WITH_DELTA = ("bm25l", "bm25+")
KNOBS = ("variant", "k1", "b", "delta")
DEFAULT_DELTA = 0.5  # bm25s's default for both delta variants


def _fmt(x: float) -> str:
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


@dataclass(frozen=True)
class Scorer:
    """One BM25 variant with its parameters (immutable: swapped whole when retuned)."""

    variant: str = "bm25"
    k1: float = 1.5
    b: float = 0.75
    delta: float = DEFAULT_DELTA

    def describe(self) -> str:
        """Factory body: ``bm25,k1=1.5,b=0.75``; delta only for the variants that use it."""
        text = f"{self.variant},k1={_fmt(self.k1)},b={_fmt(self.b)}"
        return text + (f",delta={_fmt(self.delta)}" if self.variant in WITH_DELTA else "")

    def idf(self, df: int, n_docs: int) -> float:
        v, N = self.variant, n_docs
        if v in ("bm25", "lucene"):
            return math.log(1.0 + (N - df + 0.5) / (df + 0.5))
        if v == "robertson":  # clamped at 0, as bm25s's default (allow_negative=False)
            return math.log(max(1.0, (N - df + 0.5) / (df + 0.5)))
        if v == "atire":
            return math.log(N / df)
        if v == "bm25l":
            return math.log((N + 1) / (df + 0.5))
        return math.log((N + 1) / df)  # bm25+

    def tfc_absent(self) -> float:
        """The term-frequency part at tf = 0 (nonzero only for bm25l and bm25+)."""
        if self.variant == "bm25l":
            return (self.k1 + 1.0) * self.delta / (self.k1 + self.delta)
        return self.delta if self.variant == "bm25+" else 0.0

    @property
    def weight_scale(self) -> float:
        """Factor on the query weights so the shared ``tf (k1 + 1) / (tf + k1 L)`` kernel
        computes this variant's term-frequency part (``lucene``/``robertson`` drop k1 + 1)."""
        return 1.0 / (self.k1 + 1.0) if self.variant in ("lucene", "robertson") else 1.0


def canonical_variant(name: str, where: str) -> str:
    v = ALIASES.get(name.strip().lower(), name.strip().lower())
    if v not in VARIANTS:
        raise InvalidArgument(f"{where}: unknown BM25 variant {name!r}; known: "
                              f"{', '.join(VARIANTS)}")
    return v


def parse_scorer(opts: dict[str, str], base: Scorer, where: str) -> Scorer:
    """``base`` with the BM25 knobs of ``opts`` (``variant``, ``k1``, ``b``, ``delta``) applied.

    Keys other than the knobs are ignored here (the caller checks them)."""
    variant = canonical_variant(opts["variant"], where) if "variant" in opts else base.variant
    values = {}
    for key in ("k1", "b", "delta"):
        if key in opts:
            try:
                values[key] = float(opts[key])
            except ValueError:
                raise InvalidArgument(f"{where}: option {key}={opts[key]!r} is not a valid "
                                      f"float") from None
    k1, b = values.get("k1", base.k1), values.get("b", base.b)
    delta = values.get("delta", base.delta)
    if not (math.isfinite(k1) and k1 >= 0):
        raise InvalidArgument(f"{where}: k1 must be a finite number >= 0, got {k1}")
    if not (math.isfinite(b) and 0 <= b <= 1):
        raise InvalidArgument(f"{where}: b must be in [0, 1], got {b}")
    if "delta" in values and variant not in WITH_DELTA:
        raise InvalidArgument(f"{where}: delta applies to {' and '.join(WITH_DELTA)} only, "
                              f"not {variant}")
    if not (math.isfinite(delta) and delta >= 0):
        raise InvalidArgument(f"{where}: delta must be a finite number >= 0, got {delta}")
    return replace(base, variant=variant, k1=k1, b=b, delta=delta)


def parse_body(body: str, where: str) -> Scorer:
    """A lexical factory body: ``[VARIANT][,k1=..][,b=..][,delta=..]``."""
    from polyindex.index.protocol import parse_options
    parts = [p.strip() for p in (body or "").split(",") if p.strip()]
    opts: dict[str, str] = {}
    if parts and "=" not in parts[0]:
        opts["variant"] = parts.pop(0)
    more = parse_options(",".join(parts), where=where)
    unknown = sorted(set(more) - {"k1", "b", "delta"})
    if unknown:
        raise InvalidArgument(f"{where}: unknown option(s) {', '.join(unknown)}; the lexical "
                              f"index knows k1, b and delta (variants: {', '.join(VARIANTS)})")
    return parse_scorer({**more, **opts}, Scorer(), where)


# --------------------------------------------------------------------------- BM25L kernels
# The other variants use ``postings.bm25_search``/``bm25_score_rows`` (their tf part is
# ``tf (k1 + 1) / (tf + k1 L)`` up to a factor folded into the query weights); BM25L's
# saturates the length-normalized count, so it has its own pair, built the same way.

@numba.njit(cache=True, nogil=True)
def bm25l_search(offsets, P, tfs, doclen, qptr, qterms, qweights, k1, b, avgdl, delta,
                 has_allow, allow, scores, seen, touched, out_s, out_i):
    """BM25L top-k for a query batch over one segment, without the absent-term constant:
    each posting adds ``w * (tfc(tf) - tfc(0))``."""
    k1p1 = k1 + 1.0
    z = k1p1 * delta / (k1 + delta)
    k = out_s.shape[1]
    boff, _, _, lo, wide, shift = P
    for q in range(len(qptr) - 1):
        n = 0
        for j in range(qptr[q], qptr[q + 1]):
            t = qterms[j]
            w = qweights[j]
            for bi in range(boff[t], boff[t + 1]):
                s, e, wa, f = block_of(P, offsets, t, bi)
                for p in range(s, e):
                    d = row_in_block(lo, wide, shift, wa, f, s, p)
                    if has_allow and not allow[d]:
                        continue
                    c = tfs[p] / (1.0 - b + b * doclen[d] / avgdl)
                    scores[d] += w * (k1p1 * (c + delta) / (k1 + c + delta) - z)
                    if seen[d] == 0:
                        seen[d] = 1
                        touched[n] = d
                        n += 1
        _select(scores, seen, touched, n, k, out_s[q], out_i[q])


class BM25LRows(NamedTuple):
    """BM25L over the lexical kind's postings, as ``bm25l_search`` adds it."""
    P: tuple
    tfs: np.ndarray
    doclen: np.ndarray
    k1p1: float
    k1: float
    b: float
    avgdl: float
    delta: float
    z: float


@overload(term_score, jit_options={"cache": True, "nogil": True})
def _bm25l_term(how, w, pos, row):
    if scorer_of(how, BM25LRows):
        def bm25l(how, w, pos, row):
            c = how.tfs[pos] / (1.0 - how.b + how.b * how.doclen[row] / how.avgdl)
            return w * (how.k1p1 * (c + how.delta) / (how.k1 + c + how.delta) - how.z)
        return bm25l
    return None


@numba.njit(cache=True, nogil=True)
def bm25l_score_rows(offsets, P, tfs, doclen, qptr, qterms, qweights, k1, b, avgdl, delta,
                     rows, out):
    """BM25L scores of given rows, as ``bm25l_search`` adds them; NaN out of range."""
    k1p1 = k1 + 1.0
    how = BM25LRows(P, tfs, doclen, k1p1, k1, b, avgdl, delta, k1p1 * delta / (k1 + delta))
    score_rows(offsets, how, len(doclen), qptr, qterms, qweights, rows, out)
