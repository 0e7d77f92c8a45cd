"""The analysis prefilter: one C-level multi-literal scan over a whole block of log bytes.

:class:`Prefilter` is :class:`kk3evidence._literals.LiteralScanner` (the project's one literal
scanner) over the rules' anchors, in the analysis engine's words: :meth:`Prefilter.scan` returns
``(end_offset, anchor_id)`` pairs in ascending end offset. Anchors flagged ``single`` (anchor-only
milestones, which only need their first and last line) are reported at most once per block; the
caller finds their last occurrence with :meth:`~kk3evidence._literals.LiteralScanner.last_offsets`.
``KK3_PREFILTER=hyperscan|re2|ahocorasick`` forces the engine (see the scanner's docstring).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from kk3evidence._literals import LiteralScanner

__all__ = ["Prefilter"]


class Prefilter(LiteralScanner):
    def __init__(
        self, anchors: Sequence[str], single: Sequence[bool], engine: str | None = None
    ) -> None:
        super().__init__(
            tuple(anchors), single=single, engine=engine or os.environ.get("KK3_PREFILTER") or None
        )
        self.anchors = tuple(anchors)
        self.anchor_bytes = self.literal_bytes
        self.prepare()  # compiled now, with the rules, not on the first block

    def clone(self) -> Prefilter:
        twin = super().clone()
        assert isinstance(twin, Prefilter)
        return twin

    def scan(self, block: bytes, lo: int = 0, hi: int | None = None) -> list[tuple[int, int]]:
        """All anchor hits in ``block[lo:hi]`` as ``(end_offset, anchor_id)``."""
        return self.hits(block, lo, hi)

    def line_anchor_ids(self, line: bytes) -> list[int]:
        """Every anchor id occurring in one line (for engines whose ``exact_ids`` is false)."""
        return self.matches(line)
