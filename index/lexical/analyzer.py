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
from typing import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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

    def analyze_columns(self, texts: Sequence[str | None]) \
            -> tuple[list[str], np.ndarray, np.ndarray]:
        """Every text's terms at once, as a segment build wants them: ``(terms, flat, lens)``
        with ``terms`` the distinct terms sorted, ``flat`` each text's terms in order as ids
        into ``terms`` (int32, texts concatenated) and ``lens`` the terms per text; equal to
        ``analyze_many``'s lists (None reads as ""). Bulk builds spent most of their Python
        time in ``analyze_many``'s per-text and per-word loops (docs/SCALE.md); here ASCII texts
        are split, lowercased and dictionary-encoded by Arrow and only the distinct words
        reach Python (stopwords, the stemmer). For ASCII, Python's ``\\w`` is
        ``[A-Za-z0-9_]`` and ``lower`` is ASCII's, so a run of ``[a-z0-9_]`` of length 2 or more
        is exactly a ``\\w\\w+`` match; other texts are split by the same regex in Python."""
        if isinstance(texts, pa.ChunkedArray):
            texts = texts.combine_chunks()
        arr = (texts.cast(pa.large_string()) if isinstance(texts, pa.Array)
               else pa.array(texts, pa.large_string())).fill_null("")
        n = len(arr)
        ascii_rows = pc.string_is_ascii(arr).to_numpy(zero_copy_only=False)
        parts, order = [], []
        if ascii_rows.any():
            rows = np.flatnonzero(ascii_rows)
            parts.append(pc.split_pattern_regex(pc.ascii_lower(arr.take(pa.array(rows))),
                                                "[^a-z0-9_]+"))
            order.append(rows)
        if not ascii_rows.all():
            rows = np.flatnonzero(~ascii_rows)
            parts.append(pa.array([_WORD.findall(t.lower()) for t in
                                   arr.take(pa.array(rows)).to_pylist()],
                                  pa.large_list(pa.large_string())))
            order.append(rows)
        if not n:
            return [], np.zeros(0, np.int32), np.zeros(0, np.int64)
        lists = pa.concat_arrays([p.cast(pa.large_list(pa.large_string())) for p in parts])
        row_of_list = np.concatenate(order)  # the text each list of ``lists`` is from
        owner = row_of_list[pc.list_parent_indices(lists).to_numpy()]
        words = pc.list_flatten(lists)
        word_len = pc.utf8_length(words).to_numpy(zero_copy_only=False)
        keep = word_len >= 2  # the ASCII split leaves empty and one-letter pieces
        encoded = pc.dictionary_encode(words.filter(pa.array(keep)))
        owner = owner[keep]
        distinct = encoded.dictionary.to_pylist()
        with self._lock:  # PyStemmer objects are not thread-safe
            stems = self._stemmer.stemWords(distinct)
        stop = self.stopwords
        terms = sorted({s for w, s in zip(distinct, stems) if w not in stop})
        tid = {t: i for i, t in enumerate(terms)}
        word_term = np.fromiter((-1 if w in stop else tid[s] for w, s in zip(distinct, stems)),
                                np.int32, count=len(distinct))
        flat = word_term[encoded.indices.to_numpy(zero_copy_only=False)]
        kept = flat >= 0
        # a stable order by owning text: the ASCII and other texts' words back in row order
        # (already so when every text took one path)
        flat = flat[kept] if len(parts) == 1 else \
            flat[kept][np.argsort(owner[kept], kind="stable")]
        lens = np.bincount(owner[kept], minlength=n).astype(np.int64)
        return terms, flat, lens
