"""The rerank feature schema: feature names, their order and version, and the scorer constants.

Every trained ranker stores the schema version and names it was trained with; a model is only
served when both match what this module computes (``check``). Change any name, order, formula
or constant below -> bump ``VERSION`` (old models are then refused with a clear message).

Lexical features are computed per field: ``title``, ``body`` (the text) and ``all`` (title and
text as the lexical index sees them). Missing values are NaN, never zero: a stage that did not
retrieve a document, a dense score without a dense index, the window of a document with no
query term, statistics of an empty set.
"""
from __future__ import annotations

from polyindex.errors import InvalidArgument

VERSION = 1

FIELDS = ("title", "body", "all")

# BM25 (k1, b) settings, Dirichlet mu values and the Jelinek-Mercer lambda of the lexical features.
BM25_SETTINGS = ((1.2, 0.75), (0.9, 0.4))
DIRICHLET_MU = (100.0, 1000.0)
JM_LAMBDA = 0.4
RRF_K = 60

# Per field, in the order the numba kernel writes them (``kernels.FIELD_FEATURES`` slots).
PER_FIELD = (
    "bm25_k1.2_b0.75",   # BM25, Lucene idf, field length normalization
    "bm25_k0.9_b0.4",
    "tfidf_cos",         # cosine of (1 + log tf) x idf vectors, query vs document field
    "ql_dir_mu100",      # query likelihood, Dirichlet smoothing (sum of log probabilities)
    "ql_dir_mu1000",
    "ql_jm_l0.4",        # query likelihood, Jelinek-Mercer smoothing
    "matched",           # distinct query terms present
    "matched_frac",      # ... over the distinct query terms
    "idf_sum",           # idf of the matched terms: sum, mean, max, min
    "idf_mean",
    "idf_max",
    "idf_min",
    "idf_frac",          # matched idf over the idf of all query terms
    "tf_sum",            # term frequency of the matched terms: sum, max
    "tf_max",
    "length",            # field length in analyzed terms
    "length_norm",       # ... over the collection's average field length
    "min_window",        # shortest span holding every matched query term (proximity)
    "bigrams",           # positions where a query bigram occurs as adjacent terms
    "phrase",            # occurrences of the whole query as a phrase (NaN for 1-term queries)
)

QUERY = ("q_terms", "q_distinct", "q_idf_sum")  # per query, repeated on its candidates
NEURAL = ("dense_cos",      # query embedding . stored document embedding
          "dense_prf_cos")  # ... . mean embedding of the first PRF_DOCS candidates (fused order)
PRF_DOCS = 10
STAGES = ("lexical", "dense")                     # retrievers whose rank and score are features
FUSION = tuple(f"{s}_{w}" for s in STAGES for w in ("rank", "score")) + ("rrf", "fused_rank")

# Every other index kind's own score of the candidate (``SegmentIndex.score``), NaN where the
# collection lacks the kind. Appended after the version-1 names: models trained before they
# existed list a prefix of ``NAMES`` and keep working (``check``, ``ltr``).
KIND_SCORES = {"sparse": "sparse_sim", "multivector": "multivector_maxsim",
               "tree": "tree_path_score"}

# Appended for the transfer ranker (issue 21 part 1), after the kind scores for the same reason:
# query difficulty (idf of the query's terms, max and mean; simplified clarity, the KL
# divergence of the query's term distribution from the collection's), agreement of the
# retrieve stages (how many found the candidate, its best and mean rank among them: every
# stage of the profile, not only ``STAGES``), the document's cheap quality estimators
# (``quality``: unique-term ratio, KL divergence from the collection language model) and its
# learned quality estimate (part 4; NaN until a collection stores one).
QUERY_EXTRA = ("q_idf_max", "q_idf_mean", "q_clarity")
AGREEMENT = ("n_found", "best_rank", "mean_rank")
DOC_EXTRA = ("doc_unique_ratio", "doc_kl_coll", "doc_quality")
# The profile's own fused score (its fusion's weights, unlike ``rrf``): the transfer ranker's
# prior, so that with its trees weighted 0 it orders the window exactly as the profile does.
FUSED = ("fused_score",)
# Never seen by the general ranker (NaN when it trains, so no tree splits on it): the stored
# quality estimate scores a document against the language model of its collection's first
# write, so on a sharded collection each shard's first batch gives it another value, and
# sharded answers would differ from one node's.
GENERAL_UNSEEN = ("doc_quality",)

NAMES: tuple[str, ...] = (tuple(f"{f}.{n}" for f in FIELDS for n in PER_FIELD)
                          + QUERY + NEURAL + FUSION + tuple(KIND_SCORES.values())
                          + QUERY_EXTRA + AGREEMENT + DOC_EXTRA + FUSED)
INDEX = {n: i for i, n in enumerate(NAMES)}

# One feature per named vector field of the collection (``dense@FIELD``): the field index's
# own score of the candidate (its metric: inner product, cosine, or -squared L2 distance),
# NaN when the query carries no vector for the field or the document has none (an optional
# field). They follow ``NAMES`` in the feature matrix, in field-name order, so a collection's
# names are ``names_for(kinds)``; a trained model lists the ones it saw, and is refused by a
# collection whose named fields differ (``ltr.Ranker.check_names``).
VECTOR_PREFIX = "vec_sim@"


def is_vector_feature(name: str) -> bool:
    return name.startswith(VECTOR_PREFIX) and len(name) > len(VECTOR_PREFIX)


def vector_features(kinds) -> tuple[str, ...]:
    """``vec_sim@FIELD`` of every named vector field among a collection's index kinds."""
    return tuple(sorted(f"{VECTOR_PREFIX}{k.field}" for k in kinds.values()
                        if k.kind == "dense" and getattr(k, "field", "dense") != "dense"))


def names_for(kinds) -> tuple[str, ...]:
    """The feature names (matrix columns, in order) of a collection with these kinds."""
    extra = vector_features(kinds)
    return NAMES + extra if extra else NAMES

# Scores whose scale depends on the collection (document count, lengths, the retrievers): the
# "raw+query" transform adds them min-max normalized within each query's candidate window.
_SCALED_PER_FIELD = ("bm25_k1.2_b0.75", "bm25_k0.9_b0.4", "ql_dir_mu100", "ql_dir_mu1000",
                     "ql_jm_l0.4", "idf_sum", "idf_mean", "idf_max", "idf_min", "tf_sum",
                     "tf_max", "length", "min_window")
SCALED: tuple[str, ...] = (tuple(f"{f}.{n}" for f in FIELDS for n in _SCALED_PER_FIELD)
                           + ("dense_cos", "dense_prf_cos", "lexical_score", "dense_score", "rrf")
                           + tuple(KIND_SCORES.values()))
# The general ranker (trained on several collections, shipped) sees only what transfers across
# them (leave-one-collection-out, bench_ltr): the "all" field's lexical features, the neural
# and the fusion features, each as its rank in the query's window (its position, as a fraction
# of the window, in the window sorted by that feature, ties in fused order), except ranks and
# fractions that are already comparable.
GENERAL = tuple(n for n in NAMES if n.startswith("all.")) + NEURAL + FUSION
GENERAL_AS_IS = ("all.tfidf_cos", "all.matched_frac", "all.idf_frac", "lexical_rank",
                 "dense_rank", "fused_rank")


# The transfer ranker ("normalized" transform, the shipped ``general`` model since issue 21):
# every score whose scale depends on the collection or the query enters three times, each
# normalized within the query's window: its rank (a fraction of the window, as "general"),
# its z-score and its ratio to the window's maximum (NaN where the maximum is not positive);
# the rest enters as computed (ranks, fractions, counts, query-level values).
NORMALIZED = (tuple(f"all.{n}" for n in ("bm25_k1.2_b0.75", "bm25_k0.9_b0.4", "tfidf_cos",
                                         "ql_dir_mu100", "ql_dir_mu1000", "ql_jm_l0.4",
                                         "idf_sum", "tf_sum", "min_window", "bigrams"))
              + ("title.bm25_k1.2_b0.75", "body.bm25_k1.2_b0.75")
              + NEURAL + ("lexical_score", "dense_score", "rrf") + tuple(KIND_SCORES.values()))
NORMALIZED_AS_IS = (("all.matched", "all.matched_frac", "all.idf_frac", "all.length_norm",
                     "all.phrase", "title.matched_frac", "title.length_norm")
                    + ("lexical_rank", "dense_rank", "fused_rank") + QUERY + QUERY_EXTRA
                    + AGREEMENT + DOC_EXTRA + FUSED)


def describe() -> dict:
    return {"version": VERSION, "names": list(NAMES), "per_vector_field": f"{VECTOR_PREFIX}FIELD"}


def scaled(base) -> list[str]:
    """The names of ``base`` whose scale depends on the collection (``SCALED``, and every
    vector field's similarity: inner products and L2 distances have no fixed range)."""
    return [n for n in SCALED if n in base] + [n for n in base if is_vector_feature(n)]


def check(version, names, *, what: str) -> None:
    """Refuse a model trained on another feature schema, with a message that says what to do."""
    if version != VERSION:
        raise InvalidArgument(
            f"{what} was trained with feature schema version {version!r}, but this polyindex "
            f"computes version {VERSION}; retrain it with `polyindex train-ranker`")
    # A model's names are its input columns, by name: any subset of today's names works
    # (features added later, such as the kind scores, are simply not among its inputs).
    unknown = [n for n in names if n not in INDEX and not is_vector_feature(n)]
    if unknown or len(set(names)) != len(names) or not len(names):
        raise InvalidArgument(f"{what}: its feature names do not match feature schema version "
                              f"{VERSION} (unknown: {unknown[:5]}; the model files are "
                              f"inconsistent); retrain it")
