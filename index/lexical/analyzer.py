"""The lexical analyzer: Unicode word split, lowercase, English stopwords, Snowball stemming.

``Analyzer().analyze("The cafés of Zürich")`` -> ``["café", "zürich"]``. Words are runs of
two or more Unicode letters, digits and underscores (``\\w\\w+``); they are lowercased,
English stopwords (``stopwords.STOPWORDS_EN``) are dropped, and the rest are stemmed with the
Snowball English stemmer of PyStemmer: the same steps (and stopword list) as ``bm25s.tokenize(...,
stopwords="en", stemmer=Stemmer.Stemmer("english"))``. One-character words are dropped: keeping
them cost 0.006-0.010 nDCG@10 on cisi and arguana (bench/bench_quality.py).

It runs on every query, so the word -> stem mapping is memoized in a dict (stopwords map to
None); only words never seen before reach the stemmer.
"""
from __future__ import annotations

import re
import threading
from typing import Iterable

import Stemmer

from polyindex.index.lexical.stopwords import STOPWORDS_EN

_WORD = re.compile(r"\w\w+", re.UNICODE)


class Analyzer:
    """Text -> list of index terms. Thread-safe; one instance may be shared."""

    def __init__(self, *, stopwords: Iterable[str] = STOPWORDS_EN, language: str = "english",
                 max_cache: int = 2_000_000):
        self.stopwords = frozenset(stopwords)
        self.language = language
        self._stemmer = Stemmer.Stemmer(language)
        self._lock = threading.Lock()  # PyStemmer objects are not thread-safe
        self._max_cache = max_cache
        self._cache: dict[str, str | None] = {w: None for w in self.stopwords}

    def _learn(self, words: Iterable[str]) -> None:
        """Stem the words not in the cache yet; afterwards every one of ``words`` is cached."""
        cache = self._cache
        words = set(words)
        new = [w for w in words if w not in cache]
        if not new:
            return
        if len(cache) + len(new) > self._max_cache:  # bounded memory on huge vocabularies
            cache.clear()
            cache.update((w, None) for w in self.stopwords)
            new = [w for w in words if w not in cache]
        with self._lock:  # PyStemmer objects are not thread-safe
            stems = self._stemmer.stemWords(new)
        cache.update(zip(new, stems))

    def _uncached(self, words: list[str]) -> list[str]:
        """Analyze without the cache (only if another thread reset it under our feet)."""
        kept = [w for w in words if w not in self.stopwords]
        with self._lock:
            return self._stemmer.stemWords(kept)

    def analyze(self, text: str) -> list[str]:
        """The index terms of one text, in order (duplicates kept)."""
        if not text:
            return []
        words = _WORD.findall(text.lower())
        cache = self._cache
        try:
            out = [cache[w] for w in words]
        except KeyError:
            self._learn(words)
            get = cache.get
            out = [get(w, 0) for w in words]
            if 0 in out:
                return self._uncached(words)
        return [t for t in out if t is not None] if None in out else out

    def analyze_many(self, texts: Iterable[str]) -> list[list[str]]:
        """``analyze`` over many texts (build time): new words of a chunk are stemmed together."""
        texts = list(texts)
        out: list[list[str]] = []
        chunk = 4096
        for start in range(0, len(texts), chunk):
            part = [_WORD.findall(t.lower()) if t else [] for t in texts[start:start + chunk]]
            self._learn(w for words in part for w in words)
            get = self._cache.get
            for words in part:
                terms = [get(w, 0) for w in words]
                if 0 in terms:
                    out.append(self._uncached(words))
                else:
                    out.append([t for t in terms if t is not None] if None in terms else terms)
        return out
