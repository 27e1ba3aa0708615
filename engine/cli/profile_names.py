"""Profile names on the command line: ``all`` stands for every built-in profile."""
from __future__ import annotations

from typing import Sequence

from polyindex.query.profiles import builtin_profiles

ALL = "all"


def expand(names: Sequence[str], collection) -> list[str]:
    """``names`` with ``all`` replaced by the collection's built-in profiles (in their
    definition order: single kinds first, then fusions), duplicates dropped. A user profile
    named ``all`` is not reachable this way (an explicit list of names is)."""
    out: list[str] = []
    for name in names:
        for n in (builtin_profiles(list(collection.kinds)) if name == ALL else [name]):
            if n not in out:
                out.append(n)
    return out
