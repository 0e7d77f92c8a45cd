"""The one multi-literal scanner: which of a fixed set of literals occur in a buffer, and where.

Built once from its literals (``str`` or ``bytes``; ``str`` ones are searched as UTF-8 in byte
buffers), each optionally ``caseless`` (ASCII letters, as ``bytes.lower``) or ``single`` (reported
at most once per :meth:`LiteralScanner.hits` call). Users: the analysis prefilter (whole log
blocks), the rule classifier (one decoded line), the redactor (one lower-cased line) and
capture's redaction pre-filter (log blocks, plus the secrets already known).

Engines, fastest first (bench/README.md): Hyperscan (every match, overlapping, per-literal
single-match), google-re2 (one alternation in its UTF-8 mode, so literals must be valid UTF-8;
leftmost non-overlapping matches, so ``exact_ids`` is false and a caller recounts a candidate
line with :meth:`LiteralScanner.matches`), then pyahocorasick (always available; byte buffers
are decoded as latin-1, which maps bytes 1:1). :meth:`hits` uses the first that builds;
:meth:`ids`, :meth:`matches` and :meth:`any` (short texts, where a Python call per match costs
less than a Hyperscan scan's set-up) always use Aho-Corasick. Everything is built on first use
(:meth:`LiteralScanner.prepare` builds it at once).
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["LiteralScanner"]

Buffer = bytes | bytearray | memoryview
#: a Hyperscan match handler: (literal id, start, end, flags, context) -> stop?
_OnMatch = Callable[[int, int, int, int, object], object]

# ASCII-only lower-casing for str texts, the same folding as ``bytes.lower`` and Hyperscan.
_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


class LiteralScanner:
    """A fixed set of literals, searched for in many buffers. Literal ids are their indexes."""

    def __init__(
        self,
        literals: Sequence[str] | Sequence[bytes],
        *,
        single: Sequence[bool] | None = None,
        caseless: Sequence[bool] | None = None,
        engine: str | None = None,
    ) -> None:
        """``engine`` (hyperscan, re2 or ahocorasick) forces the engine of :meth:`hits`."""
        n = len(literals)
        self.literals: tuple[str | bytes, ...] = tuple(literals)
        self.literal_bytes: tuple[bytes, ...] = tuple(
            a.encode("utf-8") if isinstance(a, str) else bytes(a) for a in literals
        )
        self.single: tuple[bool, ...] = tuple(single) if single is not None else (False,) * n
        self.caseless: tuple[bool, ...] = tuple(caseless) if caseless is not None else (False,) * n
        if len(self.single) != n or len(self.caseless) != n:
            raise ValueError("LiteralScanner: single and caseless need one flag per literal")
        self._want = engine
        self._engine = ""
        # Whether hits() reports every literal of every occurrence: false for re2, known once
        # the engine is built (an attribute: the analysis engine reads it per line).
        self.exact_ids = True
        self._always = tuple(i for i, a in enumerate(self.literal_bytes) if not a)
        self._searchable = len(self._always) < n  # any literal that is not ""
        # Equal literals share one Aho-Corasick key, whose value is the first one's id (an int:
        # a comprehension over the matches stays flat): the others are added from here.
        groups: dict[tuple[bool, bytes], list[int]] = {}
        for i, a in enumerate(self.literal_bytes):
            if a:
                key = (self.caseless[i], a.lower() if self.caseless[i] else a)
                groups.setdefault(key, []).append(i)
        self._twins = {g[0]: tuple(g) for g in groups.values() if len(g) > 1}
        self._hs_db: Any = None
        self._hs_scratch: Any = None
        self._hs_tail: Any = None
        self._hs_tail_scratch: Any = None
        self._tail_done = False
        self._re2: Any = None
        self._re2_ids: dict[bytes, int] = {}
        self._re2_nocase: dict[bytes, int] = {}
        # Aho-Corasick automata, keyed by text kind ("s": str, "b": latin-1 decoded bytes):
        # (exact automaton or None, caseless automaton or None)
        self._ac: dict[str, tuple[Any, Any]] = {}

    # engines ---------------------------------------------------------------------------------
    @property
    def engine(self) -> str:
        """The engine of :meth:`hits` (compiles it on first use)."""
        if not self._engine:
            self._compile()
        return self._engine

    def _compile(self) -> None:
        want = self._want
        searchable = self._searchable
        if want in (None, "hyperscan") and searchable:
            try:
                self._hyperscan()
                self._engine = "hyperscan"
            except Exception:
                if want == "hyperscan":
                    raise
                self._hs_db = self._hs_tail = None
        if not self._engine and want in (None, "re2") and searchable:
            try:
                self._re2_build()
                self.exact_ids = False
                self._engine = "re2"
            except Exception:
                if want == "re2":
                    raise
                self._re2 = None
        if not self._engine:
            self._engine = "ahocorasick"

    def _hyperscan(self) -> None:
        import hyperscan

        ids = [i for i, a in enumerate(self.literal_bytes) if a]
        nocase = hyperscan.HS_FLAG_CASELESS

        def flags(i: int, single: bool) -> int:
            return (hyperscan.HS_FLAG_SINGLEMATCH if single else 0) | (
                nocase if self.caseless[i] else 0
            )

        db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        db.compile(
            expressions=[self.literal_bytes[i] for i in ids],
            ids=ids,
            elements=len(ids),
            flags=[flags(i, self.single[i]) for i in ids],
            literal=True,
        )
        # The database's own scratch serves this scanner (passing one costs 0.2 us a call, a
        # third of a short line's scan); clones get their own.
        self._hs_db = db

    def _tail(self) -> None:
        """With Hyperscan: the single literals again without single-match, compiled on first
        need (capture never needs it): finds their last occurrence by scanning windows from
        the end of a block (:meth:`last_offsets`)."""
        if self._tail_done:
            return
        self._tail_done = True
        singles = [i for i, a in enumerate(self.literal_bytes) if a and self.single[i]]
        if self.engine != "hyperscan" or not singles:
            return
        import hyperscan

        nocase = hyperscan.HS_FLAG_CASELESS
        tail = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        tail.compile(
            expressions=[self.literal_bytes[i] for i in singles],
            ids=singles,
            elements=len(singles),
            flags=[nocase if self.caseless[i] else 0 for i in singles],
            literal=True,
        )
        self._hs_tail = tail

    def prepare(self) -> LiteralScanner:
        """Compile everything now (the engine of :meth:`hits` and what :meth:`last_offsets`
        uses), not on first use: for a scanner built once and used (or cloned) many times."""
        self._tail()
        return self

    def _re2_build(self) -> None:
        import re2

        opts = re2.Options()
        opts.max_mem = 256 << 20
        parts = []
        for i, a in enumerate(self.literal_bytes):
            if not a:
                continue
            if self.caseless[i]:
                parts.append(b"(?i:" + re.escape(a) + b")")
                self._re2_nocase.setdefault(a.lower(), i)
            else:
                parts.append(re.escape(a))
                self._re2_ids.setdefault(a, i)
        self._re2 = re2.compile(b"|".join(parts), opts)

    def _automata(self, kind: str) -> tuple[Any, Any]:
        pair = self._ac.get(kind)
        if pair is None:
            keys = [
                a if kind == "s" and isinstance(a, str) else b.decode("latin-1")
                for a, b in zip(self.literals, self.literal_bytes, strict=True)
            ]
            exact = [(k, i) for i, k in enumerate(keys) if k and not self.caseless[i]]
            folded = [
                (k.translate(_ASCII_LOWER), i) for i, k in enumerate(keys) if k and self.caseless[i]
            ]
            pair = self._ac[kind] = (_automaton(exact), _automaton(folded))
        return pair

    def clone(self) -> LiteralScanner:
        """The same compiled literals with scratch space of its own: a Hyperscan scratch serves
        one scan at a time; the databases and automata are read-only and shared."""
        self.prepare()  # compiled before copying, so the twin shares it
        twin = copy.copy(self)
        if self._hs_db is not None:
            import hyperscan

            twin._hs_scratch = hyperscan.Scratch(self._hs_db)
            if self._hs_tail is not None:
                twin._hs_tail_scratch = hyperscan.Scratch(self._hs_tail)
        return twin

    # scans -----------------------------------------------------------------------------------
    def hits(self, block: Buffer, lo: int = 0, hi: int | None = None) -> list[tuple[int, int]]:
        """Every occurrence in ``block[lo:hi]`` as ``(end_offset, literal_id)`` (offsets in
        ``block``, end exclusive), ascending by end offset; ``single`` literals once (their
        first). Overlapping occurrences count, except with re2 (see ``exact_ids``). Nothing is
        copied for Hyperscan. Empty literals are never reported here."""
        if hi is None and lo == 0 and self._engine == "hyperscan":
            # The whole buffer (capture's blocks and lines): no view, no further call.
            hits: list[tuple[int, int]] = []
            append = hits.append

            def on_end(aid: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
                append((end, aid))

            if self._hs_scratch is None:
                self._hs_db.scan(block, match_event_handler=on_end)
            else:
                self._hs_db.scan(block, match_event_handler=on_end, scratch=self._hs_scratch)
            return hits
        n = len(block)
        hi = n if hi is None else hi
        if hi <= lo or not self._searchable:
            return []
        engine = self._engine or self.engine
        if engine == "hyperscan":
            return self._hits_hyperscan(block, lo, hi)
        if engine == "re2":
            return self._hits_re2(block, lo, hi)
        return self._hits_ac(block, lo, hi)

    def first(self, block: Buffer, lo: int = 0, hi: int | None = None) -> tuple[int, int] | None:
        """The first occurrence (lowest end offset) in ``block[lo:hi]`` as ``(end_offset,
        literal_id)``, or ``None``. With Hyperscan the scan stops there (a scan for several
        single literals otherwise runs to the end of the buffer); other engines take the
        first of :meth:`hits`."""
        hi = len(block) if hi is None else hi
        if hi <= lo or not self._searchable:
            return None
        if (self._engine or self.engine) != "hyperscan":
            got = self.hits(block, lo, hi)
            return got[0] if got else None
        import hyperscan

        found: list[tuple[int, int]] = []

        def on_match(aid: int, _start: int, end: int, _flags: int, _ctx: object) -> bool:
            found.append((lo + end, aid))
            return True  # stop the scan

        with contextlib.suppress(hyperscan.ScanTerminated):
            self._hs_scan(block, lo, hi, on_match)
        return found[0] if found else None

    def _hits_hyperscan(self, block: Buffer, lo: int, hi: int) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        append = hits.append

        def on_match(aid: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
            append((lo + end, aid))

        self._hs_scan(block, lo, hi, on_match)
        return hits

    def _hs_scan(self, block: Buffer, lo: int, hi: int, on_match: _OnMatch) -> None:
        """One Hyperscan scan of ``block[lo:hi]`` in place (a view, released after)."""
        view = memoryview(block)[lo:hi]
        try:
            if self._hs_scratch is None:
                self._hs_db.scan(view, match_event_handler=on_match)
            else:
                self._hs_db.scan(view, match_event_handler=on_match, scratch=self._hs_scratch)
        finally:
            view.release()

    def _hits_re2(self, block: Buffer, lo: int, hi: int) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        ids, nocase, single = self._re2_ids, self._re2_nocase, self.single
        seen: set[int] = set()
        for m in self._re2.finditer(block, lo, hi):
            found = m.group()
            aid = ids.get(found)
            if aid is None:
                aid = nocase.get(found.lower())
                if aid is None:  # re2 folds beyond ASCII (KELVIN SIGN is a "k"): not ours
                    continue
            if single[aid]:
                if aid in seen:
                    continue
                seen.add(aid)
            hits.append((m.end(), aid))
        return hits

    def _hits_ac(self, block: Buffer, lo: int, hi: int) -> list[tuple[int, int]]:
        text = str(memoryview(block)[lo:hi], "latin-1")
        exact, folded = self._automata("b")
        hits: list[tuple[int, int]] = []
        for ac, hay in ((exact, text), (folded, text.translate(_ASCII_LOWER) if folded else "")):
            if ac is None:
                continue
            for end, aid in ac.iter(hay):
                hits.extend((lo + end + 1, a) for a in self._twins.get(aid, (aid,)))
        if folded is not None and exact is not None:
            hits.sort(key=lambda h: h[0])  # stable: each automaton's order kept per offset
        if not any(self.single):
            return hits
        seen: set[int] = set()
        out: list[tuple[int, int]] = []
        for hit in hits:
            if self.single[hit[1]]:
                if hit[1] in seen:
                    continue
                seen.add(hit[1])
            out.append(hit)
        return out

    def matches(self, text: str | Buffer) -> list[int]:
        """Ids of the literals occurring in one short ``text`` (a ``str`` is searched for the
        literals as given, a buffer for their UTF-8 bytes), one per occurrence, in order of the
        occurrences' ends (the case-sensitive literals' occurrences, then the caseless ones').
        Empty literals are left out."""
        # Inlined, as in ids() and any(): the redactor calls these for every line it sees.
        if isinstance(text, str):
            kind, hay = "s", text
        else:
            kind, hay = "b", str(text, "latin-1")
        exact, folded = self._ac.get(kind) or self._automata(kind)
        out = [] if exact is None else [aid for _end, aid in exact.iter(hay)]
        if folded is not None:
            out += [aid for _end, aid in folded.iter(hay.translate(_ASCII_LOWER))]
        if self._twins:
            twins = self._twins
            return [a for aid in out for a in twins.get(aid, (aid,))]
        return out

    def ids(self, text: str | Buffer) -> list[int]:
        """Ids of the literals occurring in ``text``, ascending, each once:
        ``[i for i, a in enumerate(literals) if a in text]`` (caseless ones folded) in one pass."""
        # The classifier's per-line hot path on dense failure logs: no list of matches built.
        if isinstance(text, str):
            kind, hay = "s", text
        else:
            kind, hay = "b", str(text, "latin-1")
        exact, folded = self._ac.get(kind) or self._automata(kind)
        found = set(self._always)
        add = found.add
        if exact is not None:
            for _end, aid in exact.iter(hay):
                add(aid)
        if folded is not None:
            for _end, aid in folded.iter(hay.translate(_ASCII_LOWER)):
                add(aid)
        if self._twins:
            found.update([a for aid in found for a in self._twins.get(aid, ())])
        return sorted(found)

    def any(self, text: str | Buffer) -> bool:
        """Whether any literal occurs in ``text`` (stops at the first)."""
        if self._always:
            return True
        if isinstance(text, str):
            kind, hay = "s", text
        else:
            kind, hay = "b", str(text, "latin-1")
        exact, folded = self._ac.get(kind) or self._automata(kind)
        if exact is not None:
            for _ in exact.iter(hay):
                return True
        if folded is not None:
            for _ in folded.iter(hay.translate(_ASCII_LOWER)):
                return True
        return False

    def last_offsets(
        self, block: Buffer, literal_ids: Sequence[int], lo: int = 0, end: int | None = None
    ) -> dict[int, int]:
        """Start offset of the last occurrence in ``block[lo:end]`` of each given ``single``
        literal (-1 when absent)."""
        n = len(block) if end is None else end
        wanted = set(literal_ids)
        self._tail()
        if self._hs_tail is None or not wanted:
            return {aid: self._rfind(block, aid, lo, n) for aid in wanted}
        out: dict[int, int] = {}
        maxlen = max(len(self.literal_bytes[a]) for a in wanted)
        hi = n
        width = 1 << 16
        while wanted and hi > lo:
            w_lo = max(lo, hi - width)
            found = self._tail_window(block, wanted, w_lo, hi, min(n, hi + maxlen - 1))
            for aid, start in found.items():
                out[aid] = start
                wanted.discard(aid)
            hi = w_lo
            width *= 2
        for aid in wanted:
            out[aid] = -1
        return out

    def _rfind(self, block: Buffer, aid: int, lo: int, n: int) -> int:
        needle = self.literal_bytes[aid]
        data = block if isinstance(block, bytes) else bytes(block)
        if self.caseless[aid]:
            return data.lower().rfind(needle.lower(), lo, n)
        return data.rfind(needle, lo, n)

    def _tail_window(
        self, block: Buffer, wanted: set[int], w_lo: int, hi: int, stop: int
    ) -> dict[int, int]:
        lens = self.literal_bytes
        found: dict[int, int] = {}

        def on_match(aid: int, _s: int, end: int, _f: int, _c: object) -> None:
            if aid in wanted:
                start = w_lo + end - len(lens[aid])
                if w_lo <= start < hi and start > found.get(aid, -1):
                    found[aid] = start

        view = memoryview(block)[w_lo:stop]
        try:
            if self._hs_tail_scratch is None:
                self._hs_tail.scan(view, match_event_handler=on_match)
            else:
                self._hs_tail.scan(
                    view, match_event_handler=on_match, scratch=self._hs_tail_scratch
                )
        finally:
            view.release()
        return found


def _automaton(words: Sequence[tuple[str, int]]) -> Any:
    """An Aho-Corasick automaton whose value for each key is its first literal's id."""
    if not words:
        return None
    import ahocorasick

    ac = ahocorasick.Automaton()
    for key, i in words:
        if key not in ac:
            ac.add_word(key, i)
    ac.make_automaton()
    return ac
