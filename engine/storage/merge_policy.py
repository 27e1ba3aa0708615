"""Which segments to merge: a tiered (log-structured) policy, as tantivy's LogMergePolicy.

Segments are grouped into tiers by their live rows: everything below ``floor_rows`` is
tier 0, then one tier per factor of ``factor`` above it. Tier 0 is merged as soon as its
segments hold ``floor_rows`` together (small segments cost the most per row: each is a
search of its own, and the dense default scans those under 2,000 rows, or every segment
of a collection under 10,000, exactly); a higher tier holding ``factor``
segments has them merged into one (the smallest first). Inside tier 0, segments of one
power of ``factor`` (by live rows) are merged ``factor`` at a time, so a collection written
in many small batches (an embedded ``add()`` per notebook cell) keeps a few segments while it
is written, not hundreds; and once the writer has been quiet a while (``idle``: the
background merger's call), all of tier 0 becomes one segment (under ``floor_rows`` rows
together: a cheap merge), which a query over a small collection pays for the most. So a collection written in small
batches keeps ``O(factor x log(rows))`` segments, and each row is rewritten
``O(log(rows))`` times. A segment whose deleted share reaches ``deletes_pct`` is rewritten
on its own to reclaim them. No background merge produces more than ``max_rows`` live rows;
``compact`` may.

Settable per process: ``POLYINDEX_MERGE_FACTOR``, ``POLYINDEX_MERGE_FLOOR``,
``POLYINDEX_MERGE_MAX_ROWS``, ``POLYINDEX_MERGE_DELETES``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from polyindex.config import settings
from polyindex.storage.manifest import SegmentEntry


def _live(s: SegmentEntry) -> int:
    return s.n_rows - s.n_deleted


@dataclass(frozen=True)
class TieredPolicy:
    # segments of one tier merged at once. tantivy uses 8; 4 keeps a collection being written
    # at 4-9 segments instead of 13-17, which every query pays for (hybrid's p99 during
    # bench_living's writes 5.2-10.4 ms against 9.9-11.6), for 40% more rows merged
    factor: int = 4
    floor_rows: int = 20_000      # segments smaller than this are all tier 0
    max_rows: int = 5_000_000     # background merges stop growing segments here
    deletes_pct: float = 0.2      # a segment this much deleted is rewritten alone (Lucene: 20-33%)

    @classmethod
    def from_settings(cls) -> "TieredPolicy":
        s = settings()
        return cls(factor=s.merge_factor, floor_rows=s.merge_floor, max_rows=s.merge_max_rows,
                   deletes_pct=s.merge_deletes)

    def tier(self, rows: int) -> int:
        if rows < self.floor_rows:
            return 0
        return int(math.log(rows / self.floor_rows, self.factor)) + 1

    def plan(self, segments: Sequence[SegmentEntry], idle: bool = False) -> list[str] | None:
        """One merge (segment ids) the policy wants now, or None: the lowest full tier
        first, then the most-deleted segment over the threshold. ``idle``: no write for a
        while; tier 0 is then merged into one whatever its size."""
        tiers: dict[int, list[SegmentEntry]] = {}
        for s in segments:
            if _live(s) < self.max_rows:
                tiers.setdefault(self.tier(_live(s)), []).append(s)
        for t in sorted(tiers):
            members = sorted(tiers[t], key=lambda s: (_live(s), s.id))
            if t == 0:
                if len(members) >= 2 and (idle or sum(map(_live, members)) >= self.floor_rows):
                    return [s.id for s in members]  # below max_rows: floor_rows is far smaller
                group = self._small_group(members)
                if group is not None:
                    return group
                continue
            if len(members) < self.factor:
                continue
            group, total = [], 0
            for s in members:
                if len(group) == self.factor or total + _live(s) > self.max_rows:
                    break
                group.append(s.id)
                total += _live(s)
            if len(group) >= 2:
                return group
        return self._most_deleted(segments)

    def _small_group(self, members: list[SegmentEntry]) -> list[str] | None:
        """``factor`` tier-0 segments of the lowest power of ``factor`` that holds as many
        (the smallest first), else None: logarithmic rewriting below the floor too."""
        subs: dict[int, list[SegmentEntry]] = {}
        for s in members:  # members are sorted by live rows
            subs.setdefault(int(math.log(max(1, _live(s)), self.factor)), []).append(s)
        for sub in sorted(subs):
            if len(subs[sub]) >= self.factor:
                return [s.id for s in subs[sub][:self.factor]]
        return None

    def _most_deleted(self, segments: Sequence[SegmentEntry]) -> list[str] | None:
        worst = max(segments, key=lambda s: (s.n_deleted / max(1, s.n_rows), -s.n_rows),
                    default=None)
        if worst is not None and worst.n_deleted and \
                worst.n_deleted / worst.n_rows >= self.deletes_pct:
            return [worst.id]
        return None


def compact_plan(segments: Sequence[SegmentEntry], policy: TieredPolicy,
                 max_segments: int | None) -> list[str] | None:
    """The next merge of a full compaction: down to ``max_segments`` (the smallest segments
    merged into one), else each tier of the policy collapsed into one segment (up to
    ``max_rows``) and a segment left below ``floor_rows`` folded into the next smallest;
    then every segment with deleted rows rewritten (all its tombstoned rows reclaimed).
    No merge makes a segment of more than ``max_rows`` live rows, ``max_segments`` included:
    a merge's memory grows with its rows (~6.4 KB a row: docs/SCALE.md 0.1), so a
    collection larger than ``max_segments x max_rows`` keeps more segments than asked.
    None when there is nothing left to do."""
    if max_segments is not None and len(segments) > max_segments:
        smallest = sorted(segments, key=lambda s: (_live(s), s.id))
        group, total = [], 0
        for s in smallest[:len(segments) - max_segments + 1]:
            if group and total + _live(s) > policy.max_rows:
                break
            group.append(s.id)
            total += _live(s)
        if len(group) >= 2:
            return group
    if max_segments is None:
        tiers: dict[int, list[SegmentEntry]] = {}
        for s in segments:
            tiers.setdefault(policy.tier(_live(s)), []).append(s)
        for t in sorted(tiers):
            group, total = [], 0
            for s in sorted(tiers[t], key=lambda s: (_live(s), s.id)):
                if total + _live(s) > policy.max_rows:
                    break
                group.append(s.id)
                total += _live(s)
            if len(group) >= 2:
                return group
        # A lone segment below the floor is the costliest per row (the dense default scans
        # it exactly): folded into the smallest other segment.
        small = [s for s in segments if _live(s) < policy.floor_rows]
        others = sorted((s for s in segments if _live(s) >= policy.floor_rows),
                        key=lambda s: (_live(s), s.id))
        if len(small) == 1 and others and _live(small[0]) + _live(others[0]) <= policy.max_rows:
            return [small[0].id, others[0].id]
    deleted = [s for s in segments if s.n_deleted]
    if deleted:
        return [max(deleted, key=lambda s: s.n_deleted).id]
    return None
