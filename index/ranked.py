"""What a lane's plan answers from its ``_ranked`` (ids and float32 or float64 scores, or
None: the general path answers): ``search`` as ``Hit`` objects, ``rank`` as a ``Ranking``."""
from __future__ import annotations

import numpy as np

from polyindex.types import Hit, Ranking

_F64 = np.dtype(np.float64)


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
        if got is None:
            return None
        scores = got[1]  # float64 already: no copy (a copy is ~0.25 us of a ~6 us query)
        return Ranking(got[0], scores if scores.dtype is _F64 else scores.astype(_F64))
