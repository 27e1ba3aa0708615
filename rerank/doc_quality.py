"""The learned document quality estimate computed at ingest (issue 21 part 4), and the
collection language model it is computed against.

Per document, from its analyzed terms (title and text, the default lexical analyzer): the
cheap estimators of ``quality`` (unique-term ratio, KL(P(t|D) || P(t|C)) over the document's
terms with a collection term probability, log length), scored by a small LightGBM model
(``rerank/models/quality/quality.txt``, trained by ``bench/train_quality.py`` on the shared
collections to predict "judged relevant to at least one query") into a probability: the
document's quality, stored as the float32 ``_quality`` column of its segment.

The collection language model (term counts) is a collection artifact (``artifacts/quality/``,
with a copy of the model), fixed when the collection's first write computes it: a bulk
ingest reads its whole input once beforehand (streamed in chunks of texts, so memory stays
bounded) and uses the statistics of what it indexes; a first online write or ``add`` uses
its own batch. Every later write (online, ``add``, a
later bulk run) uses the stored model, so a document's quality, and whether it is pruned,
never depends on which batch or segment it came in (terms the model has not seen count as
absent). Encoder-side signals are not used: computing them needs the encoding that pruning
exists to save.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from polyindex.errors import Corrupt, InvalidArgument
from polyindex.index.lexical.analyzer import Analyzer
from polyindex.rerank.forest import Forest
from polyindex.rerank.quality import term_estimates

ARTIFACT = "quality"
LM_FILE = "lm.npz"
MODEL_FILE = "quality.txt"
SHIPPED = Path(__file__).resolve().parent / "models" / "quality" / MODEL_FILE
FEATURES = ("unique_ratio", "kl_coll", "log_length")
COLUMN = "_quality"     # float32 column of docs.arrow (NaN: not estimated)
PRUNED = "_pruned"      # bool column of docs.arrow: kept out of the costly representations
TIE_BREAK = 1e-4        # weight of the KL tie-breaker in the stored quality (``Gate.quality``)

_ANALYZER: Analyzer | None = None


def analyzer() -> Analyzer:
    global _ANALYZER
    if _ANALYZER is None:
        _ANALYZER = Analyzer()
    return _ANALYZER


def check_fraction(p) -> float:
    """``--prune-quality`` P: a number in [0, 1)."""
    if isinstance(p, bool) or not isinstance(p, (int, float, str)):
        raise InvalidArgument(f"prune_quality must be a number in [0, 1), got {p!r}")
    try:
        v = float(p)
    except ValueError:
        raise InvalidArgument(f"prune_quality must be a number in [0, 1), got {p!r}") from None
    if not (0.0 <= v < 1.0) or math.isnan(v):
        raise InvalidArgument(f"prune_quality must be in [0, 1), got {p!r}")
    return v


class LanguageModel:
    """Term counts of a collection: a vocabulary (term -> id) and counts."""

    def __init__(self, terms: Sequence[str] = (), counts: np.ndarray | None = None):
        self.vocab = {t: i for i, t in enumerate(terms)}
        self.counts = np.zeros(len(self.vocab), np.int64) if counts is None else counts

    def ids(self, terms: list[str], grow: bool) -> np.ndarray:
        if grow:
            v = self.vocab
            return np.fromiter((v.setdefault(t, len(v)) for t in terms), np.int64, len(terms))
        get = self.vocab.get
        return np.fromiter((get(t, -1) for t in terms), np.int64, len(terms))

    def add(self, texts: Sequence[str]) -> None:
        for terms in analyzer().analyze_many(texts):
            ids = self.ids(terms, grow=True)
            if len(self.vocab) > len(self.counts):
                grown = np.zeros(max(len(self.vocab), 2 * len(self.counts)), np.int64)
                grown[:len(self.counts)] = self.counts
                self.counts = grown
            np.add.at(self.counts, ids, 1)

    def probabilities(self) -> np.ndarray:
        c = self.counts[:len(self.vocab)].astype(np.float64)
        total = c.sum()
        return c / total if total > 0 else c

    def save(self, path: Path) -> None:
        terms = np.array(sorted(self.vocab, key=self.vocab.get) or [""][:0], dtype=str)
        with open(path, "wb") as f:
            np.savez(f, terms=terms, counts=self.counts[:len(self.vocab)])

    @classmethod
    def load(cls, path: Path) -> "LanguageModel":
        try:
            with np.load(path, allow_pickle=False) as z:
                terms, counts = z["terms"], z["counts"]
        except (OSError, ValueError, KeyError, EOFError) as e:
            raise Corrupt(f"{path}: cannot read the quality language model: {e}") from e
        if terms.ndim != 1 or counts.shape != terms.shape or counts.dtype.kind != "i" \
                or (len(terms) and terms.dtype.kind != "U"):
            raise Corrupt(f"{path}: quality language model of terms {terms.shape} "
                          f"{terms.dtype}, counts {counts.shape} {counts.dtype}")
        return cls(terms.tolist(), counts.astype(np.int64))


def features(texts: Sequence[str], lm: LanguageModel) -> np.ndarray:
    """(n, 3) float32: unique-term ratio, KL from the collection LM, log(1 + length);
    NaN ratio and KL for a document without terms."""
    p_coll = lm.probabilities()
    out = np.full((len(texts), len(FEATURES)), np.nan, np.float32)
    for i, terms in enumerate(analyzer().analyze_many(texts)):
        n = len(terms)
        out[i, 2] = math.log1p(n)
        if n:
            out[i, 0], out[i, 1] = term_estimates(np.sort(lm.ids(terms, grow=False)), p_coll)
    return out


class QualityModel:
    def __init__(self, text: str, where: str = "quality model"):
        try:
            self.forest = Forest(text)
        except (ValueError, KeyError, IndexError) as e:
            raise Corrupt(f"{where}: not a LightGBM text model: {e}") from e
        self.text = text

    @classmethod
    def load(cls, path: Path) -> "QualityModel":
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise Corrupt(f"{path}: cannot read the quality model: {e}") from e
        return cls(text, str(path))

    def predict(self, X: np.ndarray) -> np.ndarray:
        """float32 probability that a document is ever judged relevant."""
        if not len(X):
            return np.zeros(0, np.float32)
        raw = self.forest.predict(np.ascontiguousarray(X, dtype=np.float32))
        return (1.0 / (1.0 + np.exp(-raw))).astype(np.float32)


class Gate:
    """A collection's quality estimator at write time: its language model, its model and the
    pruning threshold (None: nothing is pruned)."""

    def __init__(self, lm: LanguageModel, model: QualityModel, threshold: float | None):
        self.lm, self.model, self.threshold = lm, model, threshold

    def quality(self, texts: Sequence[str]) -> np.ndarray:
        """The model's probability, plus ``TIE_BREAK`` x KL / (1 + KL): a few dozen trees
        over three features give many equal values, and a quantile threshold over tied
        values prunes far less than P (adi at P = 0.30 pruned 20 of 82 documents, as at
        0.25); the small term orders ties by the divergence (more particular text
        ranks higher) and can only reorder model values closer than 1e-4."""
        X = features(texts, self.lm)
        kl = np.nan_to_num(X[:, 1], nan=0.0)
        return (self.model.predict(X) + TIE_BREAK * kl / (1.0 + kl)).astype(np.float32)

    def pruned(self, quality: np.ndarray) -> np.ndarray:
        if self.threshold is None:
            return np.zeros(len(quality), bool)
        return quality < np.float32(self.threshold)

    def save(self, folder: Path) -> list[str]:
        folder.mkdir(parents=True, exist_ok=True)
        self.lm.save(folder / LM_FILE)
        (folder / MODEL_FILE).write_text(self.model.text)
        return [LM_FILE, MODEL_FILE]

    @classmethod
    def load(cls, folder: Path, threshold: float | None) -> "Gate":
        return cls(LanguageModel.load(folder / LM_FILE), QualityModel.load(folder / MODEL_FILE),
                   threshold)


def threshold_for(quality: np.ndarray, p: float) -> float | None:
    """The pruning threshold of fraction ``p`` over the indexed input's qualities: documents
    strictly below it are pruned (floor(p n) of them when no qualities tie at it)."""
    if p <= 0 or not len(quality):
        return None
    q = np.sort(quality.astype(np.float32))
    return float(q[min(int(math.floor(p * len(q))), len(q) - 1)])
