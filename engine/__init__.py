"""polyindex: a retrieval engine and vector database with hybrid indexes.

Re-exports only. ``open``/``Engine`` and ``Client`` resolve on first use (PEP 562), so that
``import polyindex.client`` does not load the embedded engine's storage and encoders.
"""
from importlib import import_module

from polyindex.errors import (
    AlreadyExists,
    Corrupt,
    FailedPrecondition,
    InputError,
    Internal,
    InvalidArgument,
    NotFound,
    PolyindexError,
    ResourceExhausted,
    StorageFailed,
    Unauthenticated,
)

__all__ = ["AlreadyExists", "Corrupt", "FailedPrecondition", "InputError", "Internal",
           "InvalidArgument", "NotFound", "PolyindexError", "ResourceExhausted", "StorageFailed",
           "Unauthenticated",
           "open", "Engine", "Client", "__version__"]

_LAZY = {"open": ("polyindex.engine", "Engine"), "Engine": ("polyindex.engine", "Engine"),
         "Client": ("polyindex.client.remote", "Client"),
         "__version__": ("polyindex.cli.version", "__version__")}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'polyindex' has no attribute {name!r}")
    module, attr = _LAZY[name]
    return getattr(import_module(module), attr)
