"""polyindex: a retrieval engine and vector database with hybrid indexes."""
from polyindex.errors import (AlreadyExists, Corrupt, InputError, Internal, InvalidArgument,
                              NotFound, PolyindexError, ResourceExhausted, Unauthenticated)

__all__ = ["AlreadyExists", "Corrupt", "InputError", "Internal", "InvalidArgument", "NotFound",
           "PolyindexError", "ResourceExhausted", "Unauthenticated", "open", "Engine", "Client"]

from polyindex.engine import Engine
from polyindex.engine import Engine as open  # noqa: A001 - polyindex.open(path) -> engine
from polyindex.client import Client
