"""polyindex: a retrieval engine and vector database with hybrid indexes."""
from polyindex.errors import (AlreadyExists, Corrupt, InputError, Internal, InvalidArgument,
                              NotFound, PolyindexError, ResourceExhausted, Unauthenticated)

__all__ = ["AlreadyExists", "Corrupt", "InputError", "Internal", "InvalidArgument", "NotFound",
           "PolyindexError", "ResourceExhausted", "Unauthenticated", "open"]


def open(path, **kwargs):  # noqa: A001 - the public name mirrors builtins.open on purpose
    """Open (or create) a data directory as an embedded engine."""
    from polyindex.engine import Engine
    return Engine(path, **kwargs)
