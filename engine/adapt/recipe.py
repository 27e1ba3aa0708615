"""The one set of adaptation hyperparameters used for every collection.

Chosen once (docs/notes/adapt.md says on which collections and with which runs); nothing in
adapt reads a collection's qrels, and nothing here is tuned per collection.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Recipe:
    # --- what is learnt from
    min_docs: int = 200          # below this a corpus is refused (too few to learn from)
    queries_per_doc: int = 2     # synthetic queries made per document (span, terms, title)
    max_queries: int = 12_000    # bounds teacher and training cost on large corpora
    span_words: tuple[int, int] = (6, 16)   # a span query's length in words (inverse cloze)
    term_words: tuple[int, int] = (3, 6)    # a terms query's length: the doc's distinctive terms
    ict_remove: float = 0.5      # chance a span is cut out of its positive (inverse cloze)
    # --- the teacher
    depth: int = 30              # teacher ranks asked for per query
    keep_rank: int = 3           # pair kept only if the source document is in the teacher's top
    neg_ranks: tuple[int, int] = (10, 30)   # hard negatives drawn from these ranks ...
    neg_source: str = "teacher"  # ... of the teacher's ranking, or "lexical": BM25's (DPR's
    #                              negatives: sharing the query's words, not its source)
    min_pairs: int = 64          # fewer kept pairs than this: nothing to learn from
    # --- the student
    max_seq_length: int = 128
    batch_size: int = 32
    epochs: int = 1
    max_steps: int = 100          # bounds CPU: ~18 CPU s a step of 32 on this machine
    lr: float = 5e-5             # few steps: a larger rate than long GPL-style runs use
    warmup: float = 0.1          # fraction of steps
    scale: float = 20.0          # cosine-similarity temperature of the contrastive loss
    word_dropout: float = 0.1    # input noise: words dropped from a query
    shuffle_terms: bool = True   # input noise: a terms query's words in random order
    rounds: int = 1              # >1: the student (fused with the teacher) labels again
    # the base's share in a weight-space average with the student (0: the student as trained);
    # 0.5 chosen on cranfield and medline, where the whole student lost (notes: adapt.md)
    average: float = 0.5
    bf16: bool = True            # bf16 autocast when the device has it (measured: notes)
    # --- the guard (adapt.guard): commit only a student better on held-back queries
    guard_share: float = 0.1     # share of documents whose synthetic queries are held back
    guard_min_queries: int = 100  # ... but at least this many held-back queries
    guard_pool: int = 3000       # documents the held-back queries are retrieved among (cost)
    guard_margin: float = 0.02   # student MRR must be >= (1 + margin) x the current encoder's

    def to_json(self) -> dict:
        return asdict(self)


DEFAULT = Recipe()
