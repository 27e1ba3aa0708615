"""English stopwords of the lexical analyzer.

The same list as bm25s's ``"en"`` stopwords (``bm25s.stopwords.STOPWORDS_EN``, itself the
classic Lucene/Elasticsearch English list), copied here so the analyzer needs no bm25s at run
time and BM25 results stay comparable with bm25s.
"""
from __future__ import annotations

STOPWORDS_EN: frozenset[str] = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is",
    "it", "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there",
    "these", "they", "this", "to", "was", "will", "with",
))
