"""The one exception hierarchy of polyindex.

Every error a user can cause is one of these; the gRPC layer maps them to status codes in
one place (see ``STATUS_NAMES``). Messages say what was wrong and where (file:line, field, id).
"""
from __future__ import annotations

import contextvars
import errno
import os
from typing import Callable


def did_you_mean(name, choices) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to a misspelt ``name`` (difflib), or
    ''. The messages that name an unknown profile, collection or field end with it."""
    import difflib
    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, [str(c) for c in choices], n=1, cutoff=0.6)
    if not close:  # "Hybrid" for "hybrid": case alone
        close = [c for c in map(str, choices) if c.lower() == name.lower()][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""


def install_hint(extra: str, package: str) -> str:
    """How to install an optional extra, as a line that works: the package itself with
    polyindex's own bounds (read from the installed metadata, which pyproject.toml writes),
    e.g. ``pip install 'h5py>=3.8'``. ``pip install 'polyindex[EXTRA]'`` fails wherever
    polyindex is not on the package index (a source checkout), so it is only the second way."""
    import re
    from importlib import metadata
    spec = package
    try:
        for req in metadata.requires("polyindex") or []:
            name, _, marker = req.partition(";")
            if re.search(rf"extra\s*==\s*['\"]{re.escape(extra)}['\"]", marker) and \
                    re.match(rf"{re.escape(package)}\b", name.strip()):
                spec = name.strip()
    except metadata.PackageNotFoundError:
        pass
    return (f"pip install '{spec}' (or, in a polyindex checkout, pip install '.[{extra}]')")


class PolyindexError(Exception):
    """Base of every polyindex error."""

    status = "INTERNAL"


class InvalidArgument(PolyindexError):
    status = "INVALID_ARGUMENT"


class NotFound(PolyindexError):
    status = "NOT_FOUND"


class AlreadyExists(PolyindexError):
    status = "ALREADY_EXISTS"


class Unauthenticated(PolyindexError):
    status = "UNAUTHENTICATED"


class ResourceExhausted(PolyindexError):
    status = "RESOURCE_EXHAUSTED"


class FailedPrecondition(PolyindexError):
    """The system is not in a state to do this (a read-only engine asked to write, a data
    directory another process writes)."""

    status = "FAILED_PRECONDITION"


class Cancelled(PolyindexError):
    """The client cancelled the call or went away (its deadline passed, the server is
    stopping): the work it asked for stopped, nothing of it was written."""

    status = "CANCELLED"


# Long work a request triggers (encoding an Upsert's documents) calls ``check_cancelled``
# between its steps; the server sets, per call, how to tell that the call is over.
cancelled: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar(
    "polyindex_cancelled", default=None)


def check_cancelled(what: str) -> None:
    check = cancelled.get()
    if check is not None and check():
        raise Cancelled(f"{what} stopped: the call was cancelled (client gone, deadline "
                        "passed or the server stopping); nothing was written")


class Corrupt(PolyindexError):
    """Stored data failed a check (bad checksum, unreadable file, newer format)."""

    status = "DATA_LOSS"


class Internal(PolyindexError):
    status = "INTERNAL"


class StorageFailed(PolyindexError, OSError):
    """An I/O error (EIO, EROFS, ...) while a write was made durable: nothing of the write was
    kept and it may be retried. Still an ``OSError`` (errno, filename) for code that reads it."""

    status = "UNAVAILABLE"

    def __str__(self) -> str:  # the message, without OSError's "[Errno N]" prefix
        return self.strerror or super().__str__()


class InputError(InvalidArgument):
    """A bad input record, located by source file and line (or row)."""

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None,
                 field: str | None = None, doc_id: str | None = None):
        where = []
        if source is not None:
            where.append(f"{source}:{line}" if line is not None else source)
        elif line is not None:
            where.append(f"line {line}")
        if doc_id is not None:
            where.append(f"id={doc_id!r}")
        if field is not None:
            where.append(f"field {field!r}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)
        self.source, self.line, self.field, self.doc_id = source, line, field, doc_id
        self.reason = message


STATUS_NAMES = {cls: cls.status for cls in (
    InvalidArgument, NotFound, AlreadyExists, Unauthenticated, ResourceExhausted,
    FailedPrecondition, Cancelled, Corrupt, Internal, StorageFailed)}


# -- a full disk -----------------------------------------------------------------------------
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in DISK_FULL


def disk_full(e: OSError, what: str, kept: str, path: bool = True) -> ResourceExhausted:
    """A full disk as RESOURCE_EXHAUSTED: ``what`` was being done, ``kept`` what survives (the
    one wording of the WAL, the service and the CLI)."""
    where = f": {e.filename}" if path and e.filename else ""
    return ResourceExhausted(f"{what}: the disk is full ({os.strerror(e.errno)}{where}); {kept}")

