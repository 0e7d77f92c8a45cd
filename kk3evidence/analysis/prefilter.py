"""One C-level multi-literal scan over a whole block of log bytes.

:class:`Prefilter` finds every occurrence of the rules' literal anchors in a block and returns
``(end_offset, anchor_id)`` pairs in ascending end offset. Anchors flagged ``single`` (anchor-only
milestones, which only need their first and last line) are reported at most once per block; the
caller finds their last occurrence with ``bytes.rfind``.

Engines, fastest first (measured in bench/README.md): Hyperscan (all matches, overlapping, with
per-anchor single-match), google-re2 (one alternation; leftmost non-overlapping matches, so the
anchors of a candidate line are recounted on that line alone: ``exact_ids`` is false), then
pyahocorasick (always available). All report byte offsets (pyahocorasick runs on the block
decoded as latin-1, which maps bytes 1:1). ``KK3_PREFILTER=hyperscan|re2|ahocorasick`` forces one.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["LiteralSet", "Prefilter"]


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
        self._hs_tail: Any = None
        self._hs_tail_scratch: Any = None
        self._ac: Any = None
        self._re2: Any = None
        self._re2_ids: dict[bytes, int] = {}
        self.exact_ids = True
        want = engine or os.environ.get("KK3_PREFILTER") or None
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
                singles = [i for i, s in enumerate(self.single) if s]
                if singles:
                    # Same single anchors without single-match: finds their last occurrence by
                    # scanning windows from the end of a block.
                    tail = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
                    tail.compile(
                        expressions=[self.anchor_bytes[i] for i in singles],
                        ids=singles,
                        elements=len(singles),
                        flags=0,
                        literal=True,
                    )
                    self._hs_tail = tail
                    self._hs_tail_scratch = hyperscan.Scratch(tail)
                self.engine = "hyperscan"
            except Exception:
                if want == "hyperscan":
                    raise
                self._hs_db = None
        if not self.engine and want in (None, "re2") and self.anchors:
            try:
                import re2

                opts = re2.Options()
                opts.max_mem = 256 << 20
                alternation = b"|".join(re.escape(a) for a in self.anchor_bytes)
                self._re2 = re2.compile(alternation, opts)
                self._re2_ids = {a: i for i, a in enumerate(self.anchor_bytes)}
                self.exact_ids = False
                self.engine = "re2"
            except Exception:
                if want == "re2":
                    raise
                self._re2 = None
        # The Aho-Corasick automaton is always built: it is the last engine, and it recounts the
        # anchors of one candidate line for engines that do not report every anchor.
        self._ac = _automaton(self.anchor_bytes)
        if not self.engine:
            self.engine = "ahocorasick"

    def clone(self) -> Prefilter:
        """The same compiled anchors with scratch space of its own: a Hyperscan scratch serves
        one scan at a time, the databases and the automaton are read-only and shared."""
        twin = copy.copy(self)
        if self._hs_db is not None:
            import hyperscan

            twin._hs_scratch = hyperscan.Scratch(self._hs_db)
            if self._hs_tail is not None:
                twin._hs_tail_scratch = hyperscan.Scratch(self._hs_tail)
        return twin

    def scan(self, block: bytes, lo: int = 0, hi: int | None = None) -> list[tuple[int, int]]:
        """All anchor hits in ``block[lo:hi]`` as ``(end_offset, anchor_id)`` (offsets in
        ``block``), sorted by end offset. Nothing is copied for Hyperscan."""
        hi = len(block) if hi is None else hi
        if not self.anchors or hi <= lo:
            return []
        hits: list[tuple[int, int]] = []
        if self._hs_db is not None:
            append = hits.append

            def on_match(aid: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
                append((lo + end, aid))

            view = memoryview(block)[lo:hi]
            try:
                self._hs_db.scan(view, match_event_handler=on_match, scratch=self._hs_scratch)
            finally:
                view.release()
            return hits
        if self._re2 is not None:
            ids = self._re2_ids
            single = self.single
            seen: set[int] = set()
            for m in self._re2.finditer(block, lo, hi):
                aid = ids[m.group()]
                if single[aid]:
                    if aid in seen:
                        continue
                    seen.add(aid)
                hits.append((m.end(), aid))
            return hits
        text = str(memoryview(block)[lo:hi], "latin-1")
        seen_single: set[int] = set()
        for end, (_n, aids) in self._ac.iter(text):
            for aid in aids:
                if self.single[aid]:
                    if aid in seen_single:
                        continue
                    seen_single.add(aid)
                hits.append((lo + end + 1, aid))
        return hits

    def line_anchor_ids(self, line: bytes) -> list[int]:
        """Every anchor id occurring in one line (for engines whose ``exact_ids`` is false)."""
        if not self.anchors:
            return []
        out: list[int] = []
        for _end, (_n, ids) in self._ac.iter(line.decode("latin-1")):
            out.extend(ids)
        return out

    def last_offsets(
        self, block: bytes, anchor_ids: Sequence[int], lo: int = 0, end: int | None = None
    ) -> dict[int, int]:
        """Start offset of the last occurrence in ``block[lo:end]`` of each given single
        anchor (-1 when absent)."""
        n = len(block) if end is None else end
        wanted = set(anchor_ids)
        out: dict[int, int] = {}
        if self._hs_tail is None or not wanted:
            for aid in wanted:
                out[aid] = block.rfind(self.anchor_bytes[aid], lo, n)
            return out
        maxlen = max(len(self.anchor_bytes[a]) for a in wanted)
        hi = n
        width = 1 << 16
        lens = self.anchor_bytes
        while wanted and hi > lo:
            w_lo = max(lo, hi - width)
            found: dict[int, int] = {}

            def on_match(
                aid: int,
                _s: int,
                stop: int,
                _f: int,
                _c: object,
                w_lo: int = w_lo,
                hi: int = hi,
                found: dict[int, int] = found,
            ) -> None:
                if aid in wanted:
                    start = w_lo + stop - len(lens[aid])
                    if w_lo <= start < hi and start > found.get(aid, -1):
                        found[aid] = start

            view = memoryview(block)[w_lo : min(n, hi + maxlen - 1)]
            try:
                self._hs_tail.scan(
                    view, match_event_handler=on_match, scratch=self._hs_tail_scratch
                )
            finally:
                view.release()
            for aid, start in found.items():
                out[aid] = start
                wanted.discard(aid)
            hi = w_lo
            width *= 2
        for aid in wanted:
            out[aid] = -1
        return out


def _automaton(anchor_bytes: Sequence[bytes]) -> Any:
    import ahocorasick

    ac = ahocorasick.Automaton()
    for i, a in enumerate(anchor_bytes):
        key = a.decode("latin-1")
        prev = ac.get(key, None)
        ac.add_word(key, (len(key), (prev[1] if prev else ()) + (i,)))
    if anchor_bytes:
        ac.make_automaton()
    return ac


class LiteralSet:
    """Which of some literals occur in one decoded line: ``[i for i, a in enumerate(literals)
    if a in text]`` with one Aho-Corasick pass instead of one ``in`` per literal (hundreds of
    anchors made that the hot spot of dense failure logs)."""

    def __init__(self, literals: Sequence[str]) -> None:
        import ahocorasick

        self._always = tuple(i for i, a in enumerate(literals) if not a)  # "" is in every text
        self._ac: Any = None
        if len(self._always) < len(literals):
            ac = ahocorasick.Automaton()
            for i, a in enumerate(literals):
                if a:
                    prev = ac.get(a, ())
                    ac.add_word(a, (*prev, i))
            ac.make_automaton()
            self._ac = ac

    def ids(self, text: str) -> list[int]:
        """Ids of the literals occurring in ``text``, ascending, each once."""
        if self._ac is None:
            return list(self._always)
        found = set(self._always)
        for _end, ids in self._ac.iter(text):
            found.update(ids)
        return sorted(found)
