"""The command line's exit codes: one convention, by the error's status (README, "Exit codes").

0: done. 2: a user error, fixed by changing the command: a usage error (click's own), an
argument or input record that is wrong (INVALID_ARGUMENT, with file:line), a name that is
not there (NOT_FOUND) or already is (ALREADY_EXISTS), a missing or wrong token
(UNAUTHENTICATED). 1: everything else, the machine's or the data's state: a writer holds the
directory, a port is busy, a server is down (FAILED_PRECONDITION, UNAVAILABLE,
DEADLINE_EXCEEDED), the disk is full or a limit is met (RESOURCE_EXHAUSTED), stored data is
damaged (DATA_LOSS; ``verify`` finding damage), an internal error (INTERNAL, a traceback).
"""
from __future__ import annotations

OK, FAILED, USER_ERROR = 0, 1, 2
USER_STATUSES = frozenset({"INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "UNAUTHENTICATED"})


def exit_code(error: BaseException) -> int:
    """The exit code of a command that failed with ``error`` (a ``PolyindexError``)."""
    return USER_ERROR if getattr(error, "status", None) in USER_STATUSES else FAILED
