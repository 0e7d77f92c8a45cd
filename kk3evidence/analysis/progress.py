"""Live milestones: which stage a log being written has reached, fed as it grows.

Capture's progress line and stall watchdog ask "where is the start-up now, and when did it last
move?" while the log is still being written. This answers it with the shipped milestone rules
(``rules/milestones.toml`` and every other ``kind = "milestone"`` rule), found with the same
literal pre-filter as the full analysis, so markers live in one place. Pure: no I/O, no clock;
the caller passes the time with each block.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from kk3evidence.analysis.classify import Classifier
from kk3evidence.analysis.grammar import LogLine, parse_line
from kk3evidence.analysis.prefilter import Prefilter
from kk3evidence.analysis.rules import Rule, RuleSet, load_rules

__all__ = ["Milestone", "MilestoneWatcher", "whole_lines"]

_MAX_TEXT = 300  # characters of a milestone line kept for the progress line
_MAX_HITS = 64  # candidate lines looked at per fed block, at most
_CELL = 256 * 1024  # by position: one line per milestone marker in each this many bytes
_MAX_MEMO = 4096  # classified lines remembered (then forgotten all at once: memory flat)
_MAX_MEMO_BODY = 1024  # longer bodies are remembered by digest


@dataclass(frozen=True, slots=True)
class Milestone:
    """A milestone line seen at ``at`` (the caller's clock, seconds)."""

    stage: str
    rule: str
    text: str
    line_no: int
    at: float
    marks: str | None = None
    process: str | None = None
    rank: int | None = None
    body: str = ""  # the line without its process/level/time prefix


@dataclass(frozen=True, slots=True)
class _Markers:
    """What a watcher needs of a rule set, built once per rule set (an analysis starts one
    watcher: a prefilter build per log was a few ms, a share of a small log's time)."""

    ruleset: RuleSet
    anchors: tuple[str, ...]  # the milestone markers
    prefilter: Prefilter  # cloned per watcher (scratch space of its own)
    classifier: Classifier
    # Milestone rules by the rule set's anchor id: one anchor scan of a line serves both
    # "which milestone markers are here" and the classifier.
    marker_rules: dict[int, frozenset[str]]


_MARKERS: dict[tuple[int, str | None], _Markers] = {}


def _markers(rs: RuleSet) -> _Markers:
    key = (id(rs), os.environ.get("KK3_PREFILTER"))  # the prefilter engine follows it
    got = _MARKERS.get(key)
    if got is not None and got.ruleset is rs:
        return got
    anchors: dict[str, list[Rule]] = {}
    for r in rs.rules:
        if r.kind == "milestone" and r.stage:
            for a in r.anchors:
                anchors.setdefault(a, []).append(r)
    index = {a: i for i, a in enumerate(rs.anchors)}
    got = _Markers(
        rs,
        tuple(anchors),
        Prefilter(tuple(anchors), [False] * len(anchors)),
        Classifier(rs),
        {index[a]: frozenset(r.id for r in v) for a, v in anchors.items()},
    )
    if len(_MARKERS) >= 8:  # rule sets of tests come and go
        _MARKERS.clear()
    _MARKERS[key] = got
    return got


_MAX_PENDING = 65536  # bytes of an unfinished line kept between feeds (its tail)


def whole_lines(pending: bytes, data: bytes) -> tuple[bytes, bytes]:
    """``(the complete lines of pending + data, what is left)`` for a reader fed bytes in any
    chunking; of a line still unfinished only its last 64 KiB are kept (memory stays flat)."""
    buf = pending + data if pending else data
    cut = buf.rfind(b"\n")
    if cut < 0:
        return b"", buf[-_MAX_PENDING:]
    return buf[: cut + 1], buf[cut + 1 :][-_MAX_PENDING:]


class MilestoneWatcher:
    """Feed log bytes as they arrive (any chunking); read :attr:`stage` and :attr:`last`."""

    def __init__(
        self, ruleset: RuleSet | None = None, *, full_lines: int = 0, by_position: bool = False
    ) -> None:
        """``full_lines``: how many milestone lines in all are classified one by one (every
        rank's copy counts, for the rank matrix); beyond it, and by default, only the first
        and last line per milestone marker and block, which is enough to follow the stage.
        ``by_position``: beyond ``full_lines``, the first line per marker in each
        :data:`_CELL` bytes of the whole log instead, so the lines looked at do not depend on
        how the log was cut into blocks (the analysis's rank matrix), and nothing after the
        first ready line is looked at (the hang scan's use); a live watcher keeps the
        block's last line, which is "where is it now"."""
        rs = ruleset if ruleset is not None else load_rules()
        self._full_left = full_lines
        self._by_position = by_position
        self._offset = 0  # bytes of the log in the blocks before the current one
        self._cells: dict[int, int] = {}  # marker -> the last cell whose first line was taken
        markers = _markers(rs)
        self._anchors = markers.anchors
        self._prefilter = markers.prefilter.clone()
        self._classifier = markers.classifier
        self._marker_rules = markers.marker_rules
        # The milestone rule of a line by its body and level (see _milestone_rule).
        self._memo: dict[tuple[object, str | None], Rule | None] = {}
        self._pending = b""
        self.lines = 0
        #: the stage of the latest milestone (a requested shutdown is not a stage)
        self.stage: str | None = None
        self.stage_since: float | None = None
        self.last: Milestone | None = None
        self.ready = False
        #: every stage seen, with the time its first milestone arrived
        self.first_seen: dict[str, float] = {}

    def feed(self, data: bytes, at: float) -> list[Milestone]:
        """Consume ``data``; returns the milestones among its complete lines."""
        block, self._pending = whole_lines(self._pending, data)
        return self._block(block, at) if block else []

    def feed_lines(
        self, block: bytes, at: float, *, newlines: int | None = None
    ) -> list[Milestone]:
        """:meth:`feed` for a block of whole lines (ending with a newline, nothing pending),
        whose newlines the caller may have counted already (``newlines``)."""
        if self._pending:
            return self.feed(block, at)
        return self._block(block, at, newlines)

    def _ends(self, block: bytes) -> Iterable[int]:
        hits = self._prefilter.scan(block)
        if self._by_position:
            return self._ends_by_position(hits)
        if len(hits) <= self._full_left:
            self._full_left -= len(hits)
            return sorted({end for end, _aid in hits})
        self._full_left = 0
        # Per marker only its first and last line in the block matter for "where is it now"
        # (a flood of access-log lines is one marker): the cost per block stays bounded.
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for end, aid in hits:
            first.setdefault(aid, end)
            last[aid] = end
        ends = sorted(set(first.values()) | set(last.values()))
        if len(ends) > _MAX_HITS:
            ends = ends[: _MAX_HITS // 4] + ends[-(_MAX_HITS - _MAX_HITS // 4) :]
        return ends

    def _ends_by_position(self, hits: list[tuple[int, int]]) -> Iterator[int]:
        """The hits (ascending by end) up to ``full_lines`` in all, then per marker its first
        hit in each _CELL bytes of the whole log; lazily, so a scan that stops at the ready
        line looks at nothing after it."""
        cells = self._cells
        off = self._offset
        for end, aid in hits:
            if self._full_left > 0:
                self._full_left -= 1
                yield end
                continue
            cell = (off + end) // _CELL
            if cells.get(aid, -1) != cell:
                cells[aid] = cell
                yield end

    def _block(self, block: bytes, at: float, newlines: int | None = None) -> list[Milestone]:
        ends = self._ends(block)
        line_no = self.lines
        self.lines += block.count(b"\n") if newlines is None else newlines
        found: list[Milestone] = []
        done_to = -1
        pos = 0
        for end in ends:
            if end <= done_to:
                continue
            s = block.rfind(b"\n", 0, end) + 1
            e = block.find(b"\n", end - 1)
            done_to = e
            line_no += block.count(b"\n", pos, s) + 1  # counted from the previous line on
            pos = e + 1
            m = self._line(block[s:e], line_no, at)
            if m is not None:
                found.append(m)
                if m.marks == "ready" and self._by_position:
                    break  # (the hang scan stops at the ready line: nothing after it counts)
        self._offset += len(block)
        return found

    def _line(self, raw: bytes, line_no: int, at: float) -> Milestone | None:
        line = parse_line(line_no, raw)
        r = self._milestone_rule(line)
        if r is None:
            return None
        m = Milestone(
            r.stage or "",
            r.id,
            line.text[:_MAX_TEXT],
            line_no,
            at,
            r.marks,
            line.process,
            line.rank,
            line.body[:_MAX_TEXT],
        )
        if r.marks == "shutdown":
            return m
        if r.marks == "ready":
            self.ready = True
        self.first_seen.setdefault(m.stage, at)
        if m.stage != self.stage:
            self.stage, self.stage_since = m.stage, at
        self.last = m
        return m

    def _milestone_rule(self, line: LogLine) -> Rule | None:
        """The milestone rule (with a stage) claiming ``line``, else ``None``."""
        # When the body ends the text, the answer depends on the body and level alone: a rule
        # matches only with an anchor in the body, so anchors of the prefix add candidates that
        # cannot match (and a parsed line has no traceback role; no shutdown is asked). A crash
        # loop repeats its milestone bodies at every restart, with new times and pids.
        body: object = line.body
        if len(line.body) > _MAX_MEMO_BODY:  # config dumps: remembered by digest, not value
            digest = hashlib.blake2b(line.body.encode("utf-8", "surrogatepass"), digest_size=16)
            body = (len(line.body), digest.digest())
        key = (body, line.level)
        plain = line.text.endswith(line.body)
        if plain and key in self._memo:
            return self._memo[key]
        ids = self._all_ids(line.text)
        marker = self._marker_rules
        rule_ids = [marker[i] for i in ids if i in marker]
        r = None
        if rule_ids:
            hit = self._classifier.classify(line, ids)
            if (
                hit is not None
                and hit.rule.stage is not None
                and any(hit.rule.id in got for got in rule_ids)
            ):
                r = hit.rule
        if plain:
            if len(self._memo) >= _MAX_MEMO:
                self._memo.clear()
            self._memo[key] = r
        return r

    def _all_ids(self, text: str) -> list[int]:
        # Every rule anchor of the line, so a failure or noise rule still wins over a milestone
        # exactly as in the full analysis.
        return self._classifier.anchor_ids(text)
