from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Document(_message.Message):
    __slots__ = ("id", "title", "text", "metadata", "vectors", "tokens")
    class VectorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Vector
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Vector, _Mapping]] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    id: str
    title: str
    text: str
    metadata: _struct_pb2.Struct
    vectors: _containers.MessageMap[str, Vector]
    tokens: TokenMatrix
    def __init__(self, id: _Optional[str] = ..., title: _Optional[str] = ..., text: _Optional[str] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., vectors: _Optional[_Mapping[str, Vector]] = ..., tokens: _Optional[_Union[TokenMatrix, _Mapping]] = ...) -> None: ...

class Vector(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class TokenMatrix(_message.Message):
    __slots__ = ("values", "dim")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    dim: int
    def __init__(self, values: _Optional[_Iterable[float]] = ..., dim: _Optional[int] = ...) -> None: ...

class QueryItem(_message.Message):
    __slots__ = ("text", "vector", "vectors", "tokens")
    class VectorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Vector
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Vector, _Mapping]] = ...) -> None: ...
    TEXT_FIELD_NUMBER: _ClassVar[int]
    VECTOR_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    text: str
    vector: _containers.RepeatedScalarFieldContainer[float]
    vectors: _containers.MessageMap[str, Vector]
    tokens: TokenMatrix
    def __init__(self, text: _Optional[str] = ..., vector: _Optional[_Iterable[float]] = ..., vectors: _Optional[_Mapping[str, Vector]] = ..., tokens: _Optional[_Union[TokenMatrix, _Mapping]] = ...) -> None: ...

class QueryRequest(_message.Message):
    __slots__ = ("collection", "text", "vector", "profile", "inline_profile", "k", "filter", "explain", "with_text", "batch", "with_metadata", "vectors", "using", "tokens", "allow_partial", "fields")
    class VectorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Vector
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Vector, _Mapping]] = ...) -> None: ...
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    VECTOR_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    INLINE_PROFILE_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    WITH_TEXT_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    WITH_METADATA_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    USING_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_PARTIAL_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    collection: str
    text: str
    vector: _containers.RepeatedScalarFieldContainer[float]
    profile: str
    inline_profile: _struct_pb2.Struct
    k: int
    filter: _struct_pb2.Struct
    explain: bool
    with_text: bool
    batch: _containers.RepeatedCompositeFieldContainer[QueryItem]
    with_metadata: bool
    vectors: _containers.MessageMap[str, Vector]
    using: str
    tokens: TokenMatrix
    allow_partial: bool
    fields: FieldSelection
    def __init__(self, collection: _Optional[str] = ..., text: _Optional[str] = ..., vector: _Optional[_Iterable[float]] = ..., profile: _Optional[str] = ..., inline_profile: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., k: _Optional[int] = ..., filter: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., explain: _Optional[bool] = ..., with_text: _Optional[bool] = ..., batch: _Optional[_Iterable[_Union[QueryItem, _Mapping]]] = ..., with_metadata: _Optional[bool] = ..., vectors: _Optional[_Mapping[str, Vector]] = ..., using: _Optional[str] = ..., tokens: _Optional[_Union[TokenMatrix, _Mapping]] = ..., allow_partial: _Optional[bool] = ..., fields: _Optional[_Union[FieldSelection, _Mapping]] = ...) -> None: ...

class Hit(_message.Message):
    __slots__ = ("id", "score", "rank", "title", "text", "explain", "metadata")
    ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    id: str
    score: float
    rank: int
    title: str
    text: str
    explain: _struct_pb2.Struct
    metadata: _struct_pb2.Struct
    def __init__(self, id: _Optional[str] = ..., score: _Optional[float] = ..., rank: _Optional[int] = ..., title: _Optional[str] = ..., text: _Optional[str] = ..., explain: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class HitList(_message.Message):
    __slots__ = ("hits",)
    HITS_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[Hit]
    def __init__(self, hits: _Optional[_Iterable[_Union[Hit, _Mapping]]] = ...) -> None: ...

class QueryResponse(_message.Message):
    __slots__ = ("hits", "batch", "took_ms", "unavailable_shards")
    HITS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    TOOK_MS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_SHARDS_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[Hit]
    batch: _containers.RepeatedCompositeFieldContainer[HitList]
    took_ms: float
    unavailable_shards: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, hits: _Optional[_Iterable[_Union[Hit, _Mapping]]] = ..., batch: _Optional[_Iterable[_Union[HitList, _Mapping]]] = ..., took_ms: _Optional[float] = ..., unavailable_shards: _Optional[_Iterable[int]] = ...) -> None: ...

class UpsertRequest(_message.Message):
    __slots__ = ("collection", "documents", "expected_total")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    collection: str
    documents: _containers.RepeatedCompositeFieldContainer[Document]
    expected_total: int
    def __init__(self, collection: _Optional[str] = ..., documents: _Optional[_Iterable[_Union[Document, _Mapping]]] = ..., expected_total: _Optional[int] = ...) -> None: ...

class RowError(_message.Message):
    __slots__ = ("index", "id", "field", "message")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    index: int
    id: str
    field: str
    message: str
    def __init__(self, index: _Optional[int] = ..., id: _Optional[str] = ..., field: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class UpsertResponse(_message.Message):
    __slots__ = ("received", "upserted", "failed", "errors")
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    UPSERTED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    received: int
    upserted: int
    failed: int
    errors: _containers.RepeatedCompositeFieldContainer[RowError]
    def __init__(self, received: _Optional[int] = ..., upserted: _Optional[int] = ..., failed: _Optional[int] = ..., errors: _Optional[_Iterable[_Union[RowError, _Mapping]]] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("collection", "ids")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    collection: str
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, collection: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    def __init__(self, deleted: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("collection", "ids", "with_vectors", "fields")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    WITH_VECTORS_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    collection: str
    ids: _containers.RepeatedScalarFieldContainer[str]
    with_vectors: bool
    fields: FieldSelection
    def __init__(self, collection: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ..., with_vectors: _Optional[bool] = ..., fields: _Optional[_Union[FieldSelection, _Mapping]] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("documents", "found", "missing_ids")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    MISSING_IDS_FIELD_NUMBER: _ClassVar[int]
    documents: _containers.RepeatedCompositeFieldContainer[Document]
    found: _containers.RepeatedScalarFieldContainer[bool]
    missing_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, documents: _Optional[_Iterable[_Union[Document, _Mapping]]] = ..., found: _Optional[_Iterable[bool]] = ..., missing_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateCollectionRequest(_message.Message):
    __slots__ = ("name", "indexes", "fields", "segment_size", "model", "dtype", "profiles", "exist_ok")
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    INDEXES_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_SIZE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    EXIST_OK_FIELD_NUMBER: _ClassVar[int]
    name: str
    indexes: _containers.RepeatedScalarFieldContainer[str]
    fields: _containers.ScalarMap[str, str]
    segment_size: int
    model: str
    dtype: str
    profiles: _struct_pb2.Struct
    exist_ok: bool
    def __init__(self, name: _Optional[str] = ..., indexes: _Optional[_Iterable[str]] = ..., fields: _Optional[_Mapping[str, str]] = ..., segment_size: _Optional[int] = ..., model: _Optional[str] = ..., dtype: _Optional[str] = ..., profiles: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., exist_ok: _Optional[bool] = ...) -> None: ...

class CollectionInfo(_message.Message):
    __slots__ = ("name", "info")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    name: str
    info: _struct_pb2.Struct
    def __init__(self, name: _Optional[str] = ..., info: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class DescribeCollectionRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DropCollectionRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DropCollectionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCollectionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCollectionsResponse(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ("collection", "processes")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    collection: str
    processes: bool
    def __init__(self, collection: _Optional[str] = ..., processes: _Optional[bool] = ...) -> None: ...

class ProcessStats(_message.Message):
    __slots__ = ("pid", "role", "worker", "uptime_s", "requests", "requests_total", "restarts", "error")
    class RequestsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    pid: int
    role: str
    worker: int
    uptime_s: float
    requests: _containers.ScalarMap[str, int]
    requests_total: int
    restarts: int
    error: str
    def __init__(self, pid: _Optional[int] = ..., role: _Optional[str] = ..., worker: _Optional[int] = ..., uptime_s: _Optional[float] = ..., requests: _Optional[_Mapping[str, int]] = ..., requests_total: _Optional[int] = ..., restarts: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class CollectionStats(_message.Message):
    __slots__ = ("name", "documents", "segments", "deleted_rows", "wal_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    DELETED_ROWS_FIELD_NUMBER: _ClassVar[int]
    WAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    documents: int
    segments: int
    deleted_rows: int
    wal_bytes: int
    def __init__(self, name: _Optional[str] = ..., documents: _Optional[int] = ..., segments: _Optional[int] = ..., deleted_rows: _Optional[int] = ..., wal_bytes: _Optional[int] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("collections", "uptime_s", "requests", "requests_total", "process", "processes", "requests_all", "requests_all_total")
    class RequestsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class RequestsAllEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    COLLECTIONS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_ALL_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_ALL_TOTAL_FIELD_NUMBER: _ClassVar[int]
    collections: _containers.RepeatedCompositeFieldContainer[CollectionStats]
    uptime_s: float
    requests: _containers.ScalarMap[str, int]
    requests_total: int
    process: ProcessStats
    processes: _containers.RepeatedCompositeFieldContainer[ProcessStats]
    requests_all: _containers.ScalarMap[str, int]
    requests_all_total: int
    def __init__(self, collections: _Optional[_Iterable[_Union[CollectionStats, _Mapping]]] = ..., uptime_s: _Optional[float] = ..., requests: _Optional[_Mapping[str, int]] = ..., requests_total: _Optional[int] = ..., process: _Optional[_Union[ProcessStats, _Mapping]] = ..., processes: _Optional[_Iterable[_Union[ProcessStats, _Mapping]]] = ..., requests_all: _Optional[_Mapping[str, int]] = ..., requests_all_total: _Optional[int] = ...) -> None: ...

class FieldSelection(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class CountRequest(_message.Message):
    __slots__ = ("collection", "filter")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    collection: str
    filter: _struct_pb2.Struct
    def __init__(self, collection: _Optional[str] = ..., filter: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class CountResponse(_message.Message):
    __slots__ = ("count",)
    COUNT_FIELD_NUMBER: _ClassVar[int]
    count: int
    def __init__(self, count: _Optional[int] = ...) -> None: ...

class DeleteWhereRequest(_message.Message):
    __slots__ = ("collection", "filter")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    collection: str
    filter: _struct_pb2.Struct
    def __init__(self, collection: _Optional[str] = ..., filter: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class ScrollRequest(_message.Message):
    __slots__ = ("collection", "filter", "limit", "cursor", "fields", "with_vectors")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    WITH_VECTORS_FIELD_NUMBER: _ClassVar[int]
    collection: str
    filter: _struct_pb2.Struct
    limit: int
    cursor: str
    fields: FieldSelection
    with_vectors: bool
    def __init__(self, collection: _Optional[str] = ..., filter: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., limit: _Optional[int] = ..., cursor: _Optional[str] = ..., fields: _Optional[_Union[FieldSelection, _Mapping]] = ..., with_vectors: _Optional[bool] = ...) -> None: ...

class ScrollResponse(_message.Message):
    __slots__ = ("documents", "cursor")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    documents: _containers.RepeatedCompositeFieldContainer[Document]
    cursor: str
    def __init__(self, documents: _Optional[_Iterable[_Union[Document, _Mapping]]] = ..., cursor: _Optional[str] = ...) -> None: ...

class CreateSnapshotRequest(_message.Message):
    __slots__ = ("collection", "name")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    collection: str
    name: str
    def __init__(self, collection: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class SnapshotInfo(_message.Message):
    __slots__ = ("name", "collection", "documents", "segments", "files", "bytes", "manifest_version", "seconds", "created_at", "problem")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    name: str
    collection: str
    documents: int
    segments: int
    files: int
    bytes: int
    manifest_version: int
    seconds: float
    created_at: float
    problem: str
    def __init__(self, name: _Optional[str] = ..., collection: _Optional[str] = ..., documents: _Optional[int] = ..., segments: _Optional[int] = ..., files: _Optional[int] = ..., bytes: _Optional[int] = ..., manifest_version: _Optional[int] = ..., seconds: _Optional[float] = ..., created_at: _Optional[float] = ..., problem: _Optional[str] = ...) -> None: ...

class ListSnapshotsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSnapshotsResponse(_message.Message):
    __slots__ = ("snapshots",)
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    snapshots: _containers.RepeatedCompositeFieldContainer[SnapshotInfo]
    def __init__(self, snapshots: _Optional[_Iterable[_Union[SnapshotInfo, _Mapping]]] = ...) -> None: ...

class DeleteSnapshotRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteSnapshotResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AdaptCollectionRequest(_message.Message):
    __slots__ = ("collection", "revert", "recipe")
    class RecipeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    REVERT_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    collection: str
    revert: bool
    recipe: _containers.ScalarMap[str, str]
    def __init__(self, collection: _Optional[str] = ..., revert: _Optional[bool] = ..., recipe: _Optional[_Mapping[str, str]] = ...) -> None: ...

class AdaptCollectionResponse(_message.Message):
    __slots__ = ("collection", "encoder", "previous", "documents", "reencoded_rows", "delta_rows", "seconds", "report_json")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    ENCODER_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    REENCODED_ROWS_FIELD_NUMBER: _ClassVar[int]
    DELTA_ROWS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    collection: str
    encoder: str
    previous: str
    documents: int
    reencoded_rows: int
    delta_rows: int
    seconds: float
    report_json: str
    def __init__(self, collection: _Optional[str] = ..., encoder: _Optional[str] = ..., previous: _Optional[str] = ..., documents: _Optional[int] = ..., reencoded_rows: _Optional[int] = ..., delta_rows: _Optional[int] = ..., seconds: _Optional[float] = ..., report_json: _Optional[str] = ...) -> None: ...
