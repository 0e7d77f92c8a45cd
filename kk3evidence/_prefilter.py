"""One C-level multi-literal scan over a whole block of log bytes.

:class:`Prefilter` finds every occurrence of the rules' literal anchors in a block and returns
``(end_offset, anchor_id)`` pairs in ascending end offset. Anchors flagged ``single`` (anchor-only
milestones, which only need their first and last line) are reported at most once per block; the
caller finds their last occurrence with ``bytes.rfind``.

Engines, fastest first: Hyperscan (optional, x86), then pyahocorasick (a dependency). Both see
bytes offsets (pyahocorasick runs on the block decoded as latin-1, which maps bytes 1:1).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["Prefilter"]


class Prefilter:
    def __init__(
        self, anchors: Sequence[str], single: Sequence[bool], engine: str | None = None
    ) -> None:
        self.anchors = tuple(anchors)
        self.anchor_bytes = tuple(a.encode("utf-8") for a in anchors)
        self.single = tuple(single)
        self.engine = ""
        self._hs_db: Any = None
        self._hs_scratch: Any = None
        self._ac: Any = None
        want = engine
        if want in (None, "hyperscan") and self.anchors:
            try:
                import hyperscan

                db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
                flags = [hyperscan.HS_FLAG_SINGLEMATCH if s else 0 for s in self.single]
                db.compile(
                    expressions=list(self.anchor_bytes),
                    ids=list(range(len(self.anchors))),
                    elements=len(self.anchors),
                    flags=flags,
                    literal=True,
                )
                self._hs_db = db
                self._hs_scratch = hyperscan.Scratch(db)
                self.engine = "hyperscan"
            except Exception:
                if want == "hyperscan":
                    raise
                self._hs_db = None
        if not self.engine:
            import ahocorasick

            ac = ahocorasick.Automaton()
            for i, a in enumerate(self.anchor_bytes):
                key = a.decode("latin-1")
                prev = ac.get(key, None)
                ac.add_word(key, (len(key), (prev[1] if prev else ()) + (i,)))
            if self.anchors:
                ac.make_automaton()
            self._ac = ac
            self.engine = "ahocorasick"

    def scan(self, block: bytes) -> list[tuple[int, int]]:
        """All anchor hits in ``block`` as ``(end_offset, anchor_id)``, sorted by end offset."""
        if not self.anchors or not block:
            return []
        hits: list[tuple[int, int]] = []
        if self._hs_db is not None:
            append = hits.append

            def on_match(aid: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
                append((end, aid))

            self._hs_db.scan(block, match_event_handler=on_match, scratch=self._hs_scratch)
            return hits
        text = block.decode("latin-1")
        seen_single: set[int] = set()
        for end, (_n, ids) in self._ac.iter(text):
            for aid in ids:
                if self.single[aid]:
                    if aid in seen_single:
                        continue
                    seen_single.add(aid)
                hits.append((end + 1, aid))
        return hits

    def last_offset(self, block: bytes, anchor_id: int) -> int:
        """Start offset of the last occurrence of an anchor in ``block`` (or -1)."""
        return block.rfind(self.anchor_bytes[anchor_id])
