"""What a lane's plan answers from its ``_ranked`` (ids and float32 scores, or None: the
general path answers): ``search`` as ``Hit`` objects, ``rank`` as a ``Ranking``."""
from __future__ import annotations

import numpy as np

from polyindex.types import Hit, Ranking


class RankedPlan:
    __slots__ = ()

    def _ranked(self, snapshot, query, k: int):
        raise NotImplementedError

    def search(self, snapshot, query, k: int) -> list[Hit] | None:
        got = self._ranked(snapshot, query, k)
        if got is None:
            return None
        ids, scores = got
        return list(map(Hit, ids, scores.tolist(), range(1, len(ids) + 1)))

    def rank(self, snapshot, query, k: int) -> Ranking | None:
        """``search``'s answer as a ``Ranking`` (no ``Hit`` objects)."""
        got = self._ranked(snapshot, query, k)
        return None if got is None else Ranking(got[0], got[1].astype(np.float64))
