"""Synthetic queries made from the corpus alone (no outside generator).

Three kinds, each with its source document as the positive:

- ``span``: a sentence or a window of one (inverse cloze task); the span may be cut out of the
  positive (``ict_remove``) so the student learns context, not string overlap;
- ``terms``: a few of the document's most distinctive words (tf-idf over this corpus);
- ``title``: the document's title, when the caller knows it.

Deterministic: the same texts, recipe and seed make the same queries.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from polyindex.adapt.recipe import Recipe

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9'-]+")
_SENTENCE = re.compile(r"(?<=[.!?;])\s+|\n+")


@dataclass(frozen=True)
class SynthQuery:
    text: str
    doc: int           # row of the source document
    kind: str          # "span" | "terms" | "title"
    positive: str      # the positive's text (the document, maybe with the span cut out)


def _stopwords() -> frozenset[str]:
    from polyindex.index.lexical.stopwords import STOPWORDS_EN
    return frozenset(STOPWORDS_EN)


def terms_of(text: str, stop: frozenset[str]) -> list[str]:
    return [w for w in (m.lower() for m in _WORD.findall(text)) if len(w) > 2 and w not in stop]


def distinctive_terms(texts: Sequence[str], k: int = 8) -> list[list[str]]:
    """Per text, its ``k`` highest tf-idf terms (ties: first occurrence first)."""
    stop = _stopwords()
    tokens = [terms_of(t, stop) for t in texts]
    df = Counter(w for toks in tokens for w in set(toks))
    n = len(texts)
    out = []
    for toks in tokens:
        tf = Counter(toks)
        first = {w: i for i, w in reversed(list(enumerate(toks)))}
        # a term in one document only is as likely a typo as a topic: df >= 2 preferred
        scored = sorted(tf, key=lambda w: (-(tf[w] * math.log(n / df[w]) * (df[w] > 1 or n < 3)),
                                           first[w]))
        out.append(scored[:k])
    return out


def _span(words: list[str], rng: np.random.Generator, lo: int, hi: int) -> tuple[int, int]:
    """(start, end) of a window of lo..hi words inside ``words``."""
    n = min(len(words), int(rng.integers(lo, hi + 1)))
    start = int(rng.integers(0, len(words) - n + 1))
    return start, start + n


def span_query(text: str, rng: np.random.Generator, recipe: Recipe) -> tuple[str, str] | None:
    """(query, positive) from one sentence of ``text`` (a window of it when long)."""
    lo, hi = recipe.span_words
    sentences = [s for s in _SENTENCE.split(text) if len(s.split()) >= 4]
    if not sentences:
        return None
    sent = sentences[int(rng.integers(0, len(sentences)))]
    words = sent.split()
    start, end = _span(words, rng, lo, hi) if len(words) > hi else (0, len(words))
    query = " ".join(words[start:end])
    positive = text
    if rng.random() < recipe.ict_remove:
        rest = text.replace(query, " ", 1)
        if len(rest.split()) >= max(8, len(query.split())):  # enough context left to match
            positive = " ".join(rest.split())
    return query, positive


def terms_query(terms: list[str], text: str, rng: np.random.Generator,
                recipe: Recipe) -> tuple[str, str] | None:
    lo, hi = recipe.term_words
    if len(terms) < lo:
        return None
    n = min(len(terms), int(rng.integers(lo, hi + 1)))
    picked = sorted(rng.choice(len(terms), size=n, replace=False).tolist())
    return " ".join(terms[i] for i in picked), text


def make_queries(texts: Sequence[str], recipe: Recipe, seed: int = 0,
                 titles: Sequence[str | None] | None = None) -> list[SynthQuery]:
    """Up to ``recipe.queries_per_doc`` queries per document (kinds in turn: span, terms,
    title), at most ``recipe.max_queries`` in all (documents sampled evenly by the seed)."""
    per_doc = recipe.queries_per_doc
    rows = np.arange(len(texts))
    if len(texts) * per_doc > recipe.max_queries:
        keep = max(1, recipe.max_queries // per_doc)
        rows = np.sort(np.random.default_rng([seed, 1]).choice(len(texts), keep, replace=False))
    terms = distinctive_terms([texts[i] for i in rows])
    out: list[SynthQuery] = []
    for j, i in enumerate(rows.tolist()):
        text = texts[i]
        rng = np.random.default_rng([seed, i])
        title = titles[i].strip() if titles is not None and titles[i] else ""
        kinds = ["span", "terms"] + (["title"] if title and len(title.split()) >= 2 else [])
        start = int(rng.integers(0, len(kinds)))  # which kind leads varies by document
        made = 0
        for k in range(len(kinds)):
            if made == per_doc:
                break
            kind = kinds[(start + k) % len(kinds)]
            if kind == "span":
                got = span_query(text, rng, recipe)
            elif kind == "terms":
                got = terms_query(terms[j], text, rng, recipe)
            else:
                got = (title, text)
            if got is not None and got[0].strip():
                out.append(SynthQuery(got[0], i, kind, got[1]))
                made += 1
    return out
