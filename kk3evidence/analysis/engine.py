"""``analyze(source) -> Analysis``: stream a log (or a bundle's log) through the rules.

The fast path never iterates lines in Python: the log is read in large binary blocks cut at
the last newline, one multi-literal scan (:mod:`.prefilter`) finds the anchor hits,
newlines are counted with ``bytes.count`` to number lines, and only candidate lines are decoded,
envelope-parsed and matched. While a Python traceback is open the engine looks at every line
(frames carry no anchors but the exception line that ends them matters). Memory is bounded by
the block size plus capped finding lists, whatever the log size.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import io
import os
import re
import stat
import sys
import tarfile
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from kk3evidence._literals import LiteralScanner
from kk3evidence.analysis.budget import Budget, budgeted, coverage
from kk3evidence.analysis.causality import HintEvent, Resolution, StageEvidence, resolve
from kk3evidence.analysis.classify import Classified, Classifier
from kk3evidence.analysis.engine_config import EngineConfigCollector
from kk3evidence.analysis.envelope import WEB_CHARS
from kk3evidence.analysis.grammar import (
    IPY_FRAME_MARKS,
    TB_HEADER,
    TB_MARK,
    LogLine,
    TracebackState,
    TracebackTracker,
    decode_line,
    is_filler,
    is_interleaved_frames,
    parse_line,
)
from kk3evidence.analysis.hang import HangScan, HeldHangScan, StallInputs, apply_hang
from kk3evidence.analysis.lastresort import (
    RULE_ID as LAST_RESORT_RULE_ID,
)
from kk3evidence.analysis.lastresort import (
    ErrorLineCollector,
    continued_record,
    cut_traceback,
    interleaved_dump,
    is_message,
    last_resort,
    line_above,
)
from kk3evidence.analysis.prefilter import Prefilter
from kk3evidence.analysis.rules import Rule, RuleSet, StageHints, load_rules, load_stage_hints
from kk3evidence.analysis.serving_stall import STATS_ANCHOR, ZERO_MARK, ServingStallWatch
from kk3evidence.analysis.stall_inputs import bundle_stall_inputs
from kk3evidence.bundle.archive import BUNDLE_SUFFIXES, open_bundle
from kk3evidence.errors import InputError
from kk3evidence.model import (
    Analysis,
    AnalysisExtra,
    ContextLine,
    FailureContext,
    Finding,
    RuleInfo,
)

__all__ = ["AnalysisEngine", "analyze"]

BLOCK_SIZE = 16 * 1024 * 1024
MAX_LINE = 1024 * 1024  # longer lines are cut (the head is analysed, the rest skipped)
MAX_HITS = 5000  # classified failure/consequence lines kept (memory stays flat)
MAX_HINTS = 20000  # stage-hint lines kept (rules/stage-hints.toml)
MAX_CONTEXTS = 200  # failure lines whose surrounding lines are kept for the report
_MAX_ABOVE = 8192  # bytes kept of the line above a message tail
MAX_KEPT_TEXT = 8192  # characters of a finding's line kept (longer lines are data dumps)

# Not rule anchors: they start traceback tracking (Python's header, rich's boxed one, IPython's).
_STRUCTURAL_ANCHORS = (TB_MARK,)
# The frame marks are no prefilter anchors: inside a traceback every line is looked at anyway
# (the frame runs pass thousands of them at C speed in a dense crash), so outside one the next
# frame mark is found with Hyperscan (or bytes.find) instead of reporting every frame line.
# Python's frame first; IPython's column-0 frames (an excerpt that begins in a notebook's
# traceback) after it.
_FRAME_MARKS_LIT = (b'File "', *(m.encode() for m in IPY_FRAME_MARKS))
# Source and caret lines looked at above a traceback's first frame when its header is not in
# the log (a frame echoes one source line and up to one caret line).
_HEADERLESS_LOOKBACK = 3
# Trailing lines looked at for the last one that says something (see _note_said).
_FILLER_LOOKBACK = 256
# Levels whose lines are never an interleaved crash dump (a handled traceback escaped into a
# warning or an info record is no crash).
_NOT_ERRORS = frozenset({"DEBUG", "INFO", "WARNING"})
# A frame run (see AnalysisEngine._frame_run) stops before lines the envelope parser treats
# specially (ANSI remnants, Ray's repeat suffix) or that open a new traceback.
# (bytes.find per stop: several times faster than one regex alternation over a run)
_RUN_STOPS = (
    b"|",
    b"\x1b",
    b"\x00",
    b"^[[",
    b"[0m",
    b"[0;0m",
    b"across cluster]",
    TB_HEADER.encode(),
)
_BARE_CR = re.compile(rb"\r(?!\n)")
_MAX_RUN_PATTERNS = 64
# An indented body (or none) that the envelope parser would not peel; the lookahead refuses
# whitespace too, so it sits at the end of the indentation. Bytes it would act on anywhere in
# a line ("|", ESC, NUL, a bare CR) end the run afterwards (_RUN_STOPS, _frame_run): a
# `[^\n]*` body is matched several times faster than a class with exclusions.
_RUN_BODY = rb"(?:[ \t]+(?![ \t|>\"\[(]|(?:DEBUG|INFO|WARN|ERROR|CRITICAL)\b)[^\n]*)?\n"
_MEMO_SIZE = 4096  # lines remembered per memo (then forgotten all at once: memory flat)
# Envelopes and rule answers of lines up to _MEMO_LINE bytes are remembered until the remembered
# lines hold _MEMO_BYTES (then forgotten all at once): a dense crash repeats its 1-3 KB dump lines.
_MEMO_LINE = 64 * 1024
_MEMO_BYTES = 4 * 1024 * 1024
_MEMO_RUN = 16384  # frame runs longer than this (deep recursion) are not remembered
_MEMO_RUNS = 256  # frame-run bodies remembered (at most 4 MiB)
#: the frame-run fast path (tests switch it off to compare with the line-by-line path)
FRAME_RUNS = True
_LOG_MEMBER = "logs/combined.log"


@dataclass(slots=True)
class _Compiled:
    ruleset: RuleSet
    classifier: Classifier
    prefilter: Prefilter
    n_rule_anchors: int
    single: tuple[bool, ...]
    noise_only: tuple[bool, ...]  # anchors of noise rules only: never a reason to look at a line
    completable: frozenset[str]  # stages with completion milestones
    hints: StageHints
    hint_ids: frozenset[int]  # anchors that are `line` stage hints
    hint_needles: dict[int, str]  # their texts
    frame_funcs: frozenset[bytes]  # frame hints (fast path inside tracebacks)
    frame_subs: tuple[bytes, ...]
    # The anchor of vLLM's engine stats lines when the prefilter reports it per block (an
    # anchor-only milestone): the serving-stall scan skips blocks without it. None: always scan.
    stats_aid: int | None
    zero_aid: int  # the zero-generation stats marker (serving_stall.ZERO_MARK)


_CACHE: dict[int, _Compiled] = {}


def _compiled(ruleset: RuleSet, engine: str | None = None) -> _Compiled:
    key = id(ruleset) ^ hash(engine)
    got = _CACHE.get(key)
    if got is not None and got.ruleset is ruleset:
        return got
    anchors = list(ruleset.anchors)
    single = [all(r.simple for r in rules) for rules in ruleset.anchor_rules]
    noise_only = [all(r.kind == "noise" for r in rules) for rules in ruleset.anchor_rules]
    hints = load_stage_hints()
    structural = list(_STRUCTURAL_ANCHORS)
    structural += [n for n in hints.line_needles if n not in structural]
    for a in structural:
        anchors.append(a)
        single.append(False)
        noise_only.append(False)
    # The zero-generation stats marker: reported with the other hits, never a reason to look
    # at a line (noise-only); the serving-stall scan takes its positions.
    anchors.append(ZERO_MARK)
    single.append(False)
    noise_only.append(True)
    c = _Compiled(
        ruleset=ruleset,
        classifier=Classifier(ruleset),
        prefilter=Prefilter(anchors, single, engine=engine),
        n_rule_anchors=len(ruleset.anchors),
        single=tuple(single),
        noise_only=tuple(noise_only),
        completable=frozenset(
            r.stage
            for r in ruleset.rules
            if r.kind == "milestone" and r.stage and r.marks in ("complete", "ready")
        ),
        hints=hints,
        hint_ids=frozenset(i for i, a in enumerate(anchors) if a in set(hints.line_needles)),
        hint_needles={i: a for i, a in enumerate(anchors) if a in set(hints.line_needles)},
        frame_funcs=frozenset(f.encode() for f in (*hints.frame_funcs, *hints.cat_funcs)),
        frame_subs=tuple(sorted({n.encode() for n, _ in (*hints.frame_subs, *hints.cat_subs)})),
        stats_aid=_stats_anchor(anchors, single),
        zero_aid=len(anchors) - 1,
    )
    _CACHE[key] = c
    _run_scanner()  # the frame runs' database too, with the rules, not in the first traceback
    _frame_mark_scanner()
    return c


def _stats_anchor(anchors: list[str], single: list[bool]) -> int | None:
    aid = next((i for i, a in enumerate(anchors) if a == STATS_ANCHOR), None)
    return aid if aid is not None and single[aid] else None


_FRAME_MARKS: list[LiteralScanner | None] = []  # [scanner] once built; [None] without Hyperscan


def _frame_mark_scanner() -> LiteralScanner | None:
    """The frame mark alone, reported once (at its first occurrence) per scan: Hyperscan only
    (each engine's clone has scratch space of its own); ``None`` means ``bytes.find``."""
    if not _FRAME_MARKS:
        try:
            scanner = LiteralScanner(
                list(_FRAME_MARKS_LIT), single=[True] * len(_FRAME_MARKS_LIT), engine="hyperscan"
            ).prepare()
        except Exception:  # Hyperscan missing or unusable
            scanner = None
        _FRAME_MARKS.append(scanner)
    return _FRAME_MARKS[0]


# The function name at the end of a frame line (``File "…", line N, in <name>``).
_FRAME_FUNC = re.compile(rb", in ([^\s,]+)[ \t]*\r?$", re.M)


@dataclass(frozen=True, slots=True)
class _Shape:
    """An envelope prefix as a regex shape shared by every process and restart: its timestamp
    is any timestamp of the same form (the clock moves on within one traceback), its other
    numbers (pids, ranks, source lines) are groups that later lines must repeat exactly
    (backreferences), and ``expect`` holds this process's numbers for the first line."""

    first: bytes  # regex of the first line's envelope (numbers as groups)
    repeat: bytes  # regex of the following lines' envelope (numbers as backreferences)
    expect: tuple[bytes, ...]
    gate: bytes  # the literal head, tested before any regex
    plen: int  # the envelope's length in bytes (every line of a run has it)


_NUM = re.compile(rb"\d+")


_ShapeKey = tuple[tuple[str, bytes], ...]
_ZERO_DIGITS = bytes.maketrans(b"0123456789", b"0000000000")


def _envelope_shape(
    pfx: bytes, ts: bytes | None, memo: dict[_ShapeKey, tuple[bytes, bytes, bytes]]
) -> _Shape:
    """The shape of an envelope prefix; its regexes are remembered in ``memo`` per literal text
    and clock form (they do not depend on pids, ranks or the time: a crash loop's restarts
    share them)."""
    parts = _envelope_parts(pfx, ts)
    key = tuple(
        (kind, text if kind == "lit" else text.translate(_ZERO_DIGITS) if kind == "ts" else b"")
        for kind, text in parts
    )
    got = memo.get(key)
    if got is None:
        if len(memo) >= _MEMO_SIZE:
            memo.clear()
        got = memo[key] = _shape_regexes(parts)
    expect = tuple(text for kind, text in parts if kind == "num")
    return _Shape(got[0], got[1], expect, got[2], len(pfx))


def _envelope_parts(pfx: bytes, ts: bytes | None) -> list[tuple[str, bytes]]:
    """``pfx`` cut into ("lit" | "ts" | "num", text) parts."""
    parts: list[tuple[str, bytes]] = []
    head, tail = pfx, b""
    if ts and pfx.count(ts) == 1:
        head, _, tail = pfx.partition(ts)
    for chunk, kind in ((head, "pre"), (ts or b"", "ts"), (tail, "post")):
        if kind == "ts":
            if chunk and pfx.count(chunk) == 1:
                parts.append(("ts", chunk))
            continue
        pos = 0
        for m in _NUM.finditer(chunk):
            parts.append(("lit", chunk[pos : m.start()]))
            parts.append(("num", m.group()))
            pos = m.end()
        parts.append(("lit", chunk[pos:]))
    return parts


def _shape_regexes(parts: list[tuple[str, bytes]]) -> tuple[bytes, bytes, bytes]:
    """(first, repeat, gate) of a shape (see _Shape) from its parts."""
    first, repeat = [], []
    nums = 0
    for kind, text in parts:
        if kind == "lit":
            esc = re.escape(text)
            first.append(esc)
            repeat.append(esc)
        elif kind == "ts":
            gen = re.sub(rb"\d", rb"\\d", re.escape(text))
            first.append(gen)
            repeat.append(gen)
        else:
            nums += 1
            first.append(rb"(\d+)")
            repeat.append(b"(?:\\%d)" % nums)
    gate = parts[0][1] if parts and parts[0][0] == "lit" else b""
    return b"".join(first), b"".join(repeat), gate


@dataclass(frozen=True, slots=True)
class _Run:
    """A frame run's bodies looked at once (see AnalysisEngine._run_of)."""

    cut: int  # how many of its lines are frames (0: none, the slow path decides)
    frame_indent: int | None  # the indentation of its last frame line
    hints: tuple[tuple[int, str | None, str | None], ...]  # (line index, stage, category)


class AnalysisEngine:
    """Incremental analyzer: :meth:`feed` bytes in any chunking, then :meth:`finish`."""

    def __init__(
        self,
        source: str = "-",
        ruleset: RuleSet | None = None,
        *,
        engine: str | None = None,
        context: int = 3,
    ) -> None:
        self.source = source
        self.context = max(0, min(context, 200))
        self._context: dict[int, dict[str, list[list[Any]]]] = {}
        self._tail: list[list[Any]] = []  # last `context` lines of the previous blocks
        self._above_tail: dict[int, bytes] = {}  # line above each message tail, by its number
        self._pending_after: list[tuple[int, list[list[Any]]]] = []  # (hit line, after list)
        self._c = _compiled(ruleset if ruleset is not None else load_rules(), engine)
        self._tracker = TracebackTracker()
        self._pending = bytearray()
        self._skipping_long = False
        self.lines = 0  # complete lines consumed
        self._hits: list[Classified] = []
        self._hint_events: list[HintEvent] = []
        self._cat_events: list[HintEvent] = []  # category hints: ``stage`` holds a category
        self._hits_dropped = 0
        self._evidence: dict[str, StageEvidence] = {}
        self._shutdown_line: int | None = None
        self._ready_line: int | None = None
        self._foreign_platform_line: int | None = None  # a platform plugin took over here
        self._long_lines = 0
        self._lo = 0  # bounds of the block being processed
        self._frame_at = -1  # the next frame mark in the block being processed (see _candidate)
        marks = _frame_mark_scanner()
        self._frame_marks = None if marks is None else marks.clone()
        self._web = _web_scanner().clone()
        self._hi = 0
        # Frame-run fast path (see _frame_run) and the memos of repeated lines.
        self._run_shape: _Shape | None = None  # the envelope of the last frame line
        self._run_key: str | None = None  # and its process
        self._pfx_memo: dict[str, _Shape] = {}
        self._shape_memo: dict[_ShapeKey, tuple[bytes, bytes, bytes]] = {}
        self._runs_memo: dict[tuple[bytes, int | None], _Run] = {}
        self._run_stop = -1  # where the last frame run ended (no second try there)
        self._run_res: dict[bytes, re.Pattern[bytes]] = {}
        self._memo: dict[tuple[object, ...], tuple[Rule, dict[str, str]] | None] = {}
        self._memo_chars = 0  # characters of the bodies in _memo's keys
        self._env_memo: dict[bytes, LogLine] = {}
        self._env_memo_bytes = 0  # raw bytes of the lines in _env_memo
        self._engine_config = EngineConfigCollector()  # what vLLM reports it runs with
        self._error_lines = ErrorLineCollector()  # the last resort's candidates (lastresort.py)
        self._serving_stall = ServingStallWatch()  # requests running, no token (serving_stall)
        self._interleaved: LogLine | None = None  # the first line of mixed stack dumps (EXC012)
        self._said = 0  # the last line that is not blank or an elision marker (_note_said)

    @property
    def prefilter_engine(self) -> str:
        return self._c.prefilter.engine

    # -- input ---------------------------------------------------------------------------

    def plain(self, data: bytes) -> bytes:
        """``data`` with the characters of web pages (envelope.WEB_CHARS) made plain, for every
        reader of the same bytes (the stall scan too); ASCII data is returned as it is."""
        if data.isascii() or self._web.first(data) is None:
            return data
        return _plain_blanks(data)

    def feed(self, data: bytes) -> None:
        if not data:
            return
        if self._skipping_long:
            nl = data.find(b"\n")
            if nl < 0:
                return
            self._skipping_long = False
            data = data[nl + 1 :]
            if not data:
                return
        cut = data.rfind(b"\n")
        if cut < 0:
            self._pending += data
            if len(self._pending) > MAX_LINE:
                self._flush_long()
            return
        start = 0
        if self._pending:
            first_nl = data.find(b"\n")
            head = bytes(self._pending) + data[: first_nl + 1]
            self._pending.clear()
            if len(head) > MAX_LINE + 1:
                head = head[:MAX_LINE] + b"\n"
                self._long_lines += 1
            self._block(head)
            start = first_nl + 1
        if cut + 1 > start:
            # No copy: the block is scanned in place between start and cut + 1.
            self._block(data, start, cut + 1)
        rest = data[cut + 1 :]
        if rest:
            self._pending += rest
            if len(self._pending) > MAX_LINE:
                self._flush_long()

    def skip_lines(self, n: int) -> None:
        """Count ``n`` lines that are not analysed (a budgeted read skips the middle of a
        huge log), so later line numbers stay the file's. Call at a line boundary."""
        self.lines += n
        self._tail.clear()  # context lines from before the gap are not "before" a later hit
        self._serving_stall.gap()  # no zero-throughput run continues across the gap

    def _flush_long(self) -> None:
        """A line longer than MAX_LINE: analyse its head, skip the rest up to its newline."""
        head = bytes(self._pending[:MAX_LINE]) + b"\n"
        self._pending.clear()
        self._long_lines += 1
        self._skipping_long = True
        self._block(head)

    def finish(self) -> Analysis:
        if self._pending:
            tail = bytes(self._pending)
            self._pending.clear()
            self._block(tail, 0, len(tail), final=True)
        self._hits = [h for h in self._hits if self._counts(h)]
        res = self._resolve()
        ff = res.first_failure
        if ff is None or self._orphan_consequence(ff):
            hit = (
                self._last_resort()
                if ff is None
                else (self._message_above(ff) or self._error_before(ff))
            )
            if hit is not None and self._counts(hit) and len(self._hits) < MAX_HITS:
                self._hits.append(hit)
                self._hits.sort(key=lambda h: h.line.line_no)
                res = self._resolve()
        ff = res.first_failure
        rule = self._c.ruleset.get(ff.rule) if ff is not None else None
        ctx = self._context.get(ff.line_no) if ff is not None else None
        extra = AnalysisExtra(
            captures=tuple(res.first_captures.items()),
            rule=None if rule is None else RuleInfo(
                name=rule.name, summary=rule.summary, why=rule.why,
                next_steps=tuple(rule.next_steps), severity=rule.severity, status=rule.status),
            context=None if ctx is None else FailureContext(
                before=tuple(ContextLine(n, decode_line(t)) for n, t in ctx["before"]),
                after=tuple(ContextLine(n, decode_line(t)) for n, t in ctx["after"])),
            notes=tuple(res.notes),
            findings_truncated=self._hits_dropped,
            long_lines_truncated=self._long_lines,
            shutdown_requested_line=self._shutdown_line,
            ready_line=self._ready_line,
            serving_stall=self._serving_stall.result(self.lines),
        )
        return Analysis(
            source=self.source,
            lines_total=self.lines,
            last_stage_reached=res.last_stage_reached,
            stages=res.stages,
            first_failure=res.first_failure,
            consequences=res.consequences,
            findings=res.findings,
            extra=extra,
            engine_config=self._engine_config.result(),
        )

    def _orphan_consequence(self, ff: Finding) -> bool:
        """The first failure is a consequence line whose cause no rule stated."""
        rule = self._c.ruleset.get(ff.rule)
        return rule is not None and rule.kind == "consequence"

    def _error_before(self, ff: Finding) -> Classified | None:
        """An error-level message no rule knew, written before an orphan consequence (the
        last resort's first candidate above it): an NPU runtime's own report before torch_npu's
        `ERR00100 PTA call acl api failed`, an embedder's error before vLLM's `EngineCore failed
        to start.`. A data record (vLLM's `dump_input` block) and echoed source do not count."""
        above = [(no, raw) for no, raw in self._error_lines.lines if no < ff.line_no]
        hit = last_resort(
            above, self._c.classifier, shutdown_line=self._shutdown_line, parse=self._parse
        )
        if hit is None or hit.rule.id != LAST_RESORT_RULE_ID or not is_message(hit.line):
            return None
        return hit

    def _message_above(self, ff: Finding) -> Classified | None:
        """The first line of the message an orphan message tail ends (``marks =
        "message_tail"``: PyTorch's ``CUDA kernel errors might be asynchronously reported …``
        under ``CUDA error: invalid argument``), reported through the last resort's rule: the
        line right above it, when the tail has no envelope of its own or shares the line's
        process, and that line is a message (words, no traceback text, not a known line)."""
        raw = self._above_tail.get(ff.line_no)
        rule = self._c.ruleset.get(LAST_RESORT_RULE_ID)
        down = self._shutdown_line
        if raw is None or rule is None or (down is not None and ff.line_no > down):
            return None
        tail = self._parse(ff.line_no, ff.text.encode())
        line = self._parse(ff.line_no - 1, raw)
        if tail.body != tail.text and (tail.process, tail.pid) != (line.process, line.pid):
            return None
        if not is_message(line) or self._c.classifier.classify(line) is not None:
            return None
        return Classified(rule=rule, line=line)

    def _counts(self, h: Classified) -> bool:
        """Whether a finding's condition (its rule's ``when``) holds in the whole log: a retry
        that may still succeed (``unready``) did not once the server became ready; a CUDA
        library missing (``cuda_platform``) is expected after an out-of-tree platform plugin
        was activated."""
        when = h.rule.when
        if when in ("unready", "device_cause"):  # device_cause's other half: causality.py
            return self._ready_line is None
        if when == "cuda_platform":
            foreign = self._foreign_platform_line
            return foreign is None or h.line.line_no < foreign
        return True

    def _last_resort(self) -> Classified | None:
        """Nothing stated a failure (lastresort.py): the earlier of the first error-level line
        no rule knew and a traceback the log ends in before its exception line."""
        down = self._shutdown_line
        error_line = last_resort(
            self._error_lines.lines,
            self._c.classifier,
            shutdown_line=down,
            parse=self._parse,
            above=self._error_lines.above,
        )
        cut = cut_traceback(
            self._tracker.cut_tracebacks(self._said), self._c.classifier, shutdown_line=down
        )
        mixed = interleaved_dump(self._interleaved, self._c.classifier, shutdown_line=down)
        found = [h for h in (error_line, cut, mixed) if h is not None]
        if not found:
            return continued_record(
                self._error_lines.lines, self._c.classifier, shutdown_line=down, parse=self._parse
            )
        return min(found, key=lambda h: h.line.line_no)

    def _note_said(self, block: bytes, lo: int, n: int, last_no: int) -> None:
        """Remember the last line of ``block[lo:n]`` (numbered up to ``last_no``) that says
        something: blank lines and a paste's elision marker ("[ ...... ]") are no more log
        after a traceback that was cut (:meth:`_last_resort`). Whole-log line numbers, so the
        answer does not depend on the blocks."""
        end = n - 1 if n > lo and block[n - 1] == 10 else n
        no = last_no
        for _ in range(_FILLER_LOOKBACK):
            if end < lo:
                return
            s = max(lo, block.rfind(b"\n", lo, end) + 1)
            if not is_filler(decode_line(block[s:end])):
                self._said = no
                return
            no -= 1
            end = s - 1
        self._said = no  # a longer run of filler lines: count the line before them as said

    def _resolve(self) -> Resolution:
        return resolve(
            self._hits,
            self._evidence,
            shutdown_line=self._shutdown_line,
            ready_line=self._ready_line,
            completable=self._c.completable,
            chain_links=self._tracker.chain_links,
            hints=self._hint_events,
            policy=self._c.hints,
            category_hints=self._cat_events,
            word_category=self._c.classifier.word_category,
        )

    # -- the block scan ------------------------------------------------------------------

    def _block(self, block: bytes, lo: int = 0, hi: int | None = None, final: bool = False) -> None:
        """Process the whole lines of ``block[lo:hi]`` (``\\n``-ended unless ``final``), no copy."""
        c = self._c
        base = self.lines
        n = len(block) if hi is None else hi
        if not block.isascii() and self._web.first(block, lo, n) is not None:
            # analyze() made whole blocks plain already; this is for other feed() callers and
            # a line whose web character straddled two read blocks (one more scan, non-ASCII
            # blocks only)
            block = _plain_blanks(block[lo:n])
            lo, n = 0, len(block)
        self._lo, self._hi = lo, n
        self._engine_config.scan(block, lo, n, base)
        self._error_lines.scan(block, lo, n, base)
        firsts, others = _split_hits(c.prefilter.scan(block, lo, n), c.single)
        stall = self._serving_stall
        # a block with engine stats lines, or any block while a zero run is open (its silence)
        if c.stats_aid is None or c.stats_aid in firsts or stall.has_open_run:
            zero = c.zero_aid
            stall.scan(block, lo, n, base, [e for e, a in others if a == zero])
        self._frame_at = -1
        tracker = self._tracker
        pos = lo
        line_no = base
        k = 0
        n_hits = len(others)
        count = block.count
        find = block.find
        while pos < n:
            if tracker.busy:
                end = self._try_frame_run(block, pos, n, line_no)
                if end > pos:
                    line_no += count(b"\n", pos, end)
                    while k < n_hits and others[k][0] <= end:
                        k += 1
                    pos = end
                    continue
                e = find(b"\n", pos, n)
                if e < 0:
                    e = n
                ids: list[int] = []
                while k < n_hits and others[k][0] <= e:
                    if others[k][0] > pos:
                        ids.append(others[k][1])
                    k += 1
                line_no += 1
                self._line(block, pos, e, line_no, ids)
                pos = e + 1
                continue
            got = self._candidate(block, pos, n, others, k)
            if got is None:
                line_no += count(b"\n", pos, n)
                break
            s, e, k, ids = got
            line_no += count(b"\n", pos, s) + 1
            self._line(block, s, e, line_no, ids)
            pos = e + 1
        # Every newline of the block was counted on the way (a last line without a newline,
        # when processed, was counted too: take it back).
        nl_total = line_no - base - (1 if pos > n else 0)
        ends_nl = n > lo and block[n - 1] == 10
        if firsts:
            self._simple_milestones(block, lo, n, base=base, firsts=firsts, nl_total=nl_total)
        self._context_bookkeeping(block, lo, n, base=base, nl_total=nl_total, ends_nl=ends_nl)
        if n > lo:
            self._note_said(block, lo, n, base + nl_total + (0 if ends_nl else 1))
        if final and n > lo and not ends_nl:
            # The last line has no newline: it still counts as a line.
            line_no = base + nl_total + 1
        self.lines = line_no
        tracker.tick(line_no)

    def _candidate(
        self, block: bytes, pos: int, n: int, others: list[tuple[int, int]], k: int
    ) -> tuple[int, int, int, list[int]] | None:
        """While no traceback is open: the next line at or after ``pos`` worth a look, the line
        of the next hit (from ``others[k]`` on) of an anchor that is not noise only, or of the
        next frame mark, as ``(start, end, next k, anchor ids of the line)``; else ``None``."""
        c = self._c
        noise_only = c.noise_only
        n_hits = len(others)
        # Noise anchors alone never make a line worth a look (noise only suppresses).
        while k < n_hits and (others[k][0] <= pos or noise_only[others[k][1]]):
            k += 1
        if self._frame_at < pos:
            self._frame_at = self._next_frame_mark(block, pos, n)
        s = n
        if k < n_hits:
            end, aid = others[k]
            alen = len(c.prefilter.anchor_bytes[aid])
            s = max(pos, block.rfind(b"\n", pos, max(pos, end - alen)) + 1)
        if self._frame_at < s:
            s = max(pos, block.rfind(b"\n", pos, self._frame_at) + 1)
        if s >= n:
            return None
        e = block.find(b"\n", s, n)
        if e < 0:
            e = n
        ids: list[int] = []
        j = k - 1
        while j >= 0 and others[j][0] > s and others[j][0] > pos:
            if others[j][0] <= e:
                ids.append(others[j][1])  # noise anchors earlier in the same line
            j -= 1
        while k < n_hits and others[k][0] <= e:
            ids.append(others[k][1])
            k += 1
        return s, e, k, ids

    def _next_frame_mark(self, block: bytes, pos: int, n: int) -> int:
        """Where the first frame mark in ``block[pos:n]`` starts, else ``n``. Hyperscan stops at
        the first (several GB/s); ``bytes.find`` runs at ~1 GB/s through access-log lines."""
        marks = self._frame_marks
        if marks is None:
            best = n
            for mark in _FRAME_MARKS_LIT:
                at = block.find(mark, pos, best)
                if at >= 0:
                    best = at
            return best
        hit = marks.first(block, pos, n)
        return n if hit is None else hit[0] - len(_FRAME_MARKS_LIT[hit[1]])

    def _context_bookkeeping(
        self, block: bytes, lo: int, n: int, *, base: int, nl_total: int, ends_nl: bool
    ) -> None:
        """Complete after-context of failures from earlier blocks; remember this block's tail
        (raw lines, as in _context_around; at least the lines a headerless traceback's start
        may need, :meth:`_headerless_start`)."""
        want = self.context
        if self._pending_after:
            still: list[tuple[int, list[list[Any]]]] = []
            for hit_no, after in self._pending_after:
                covered = after[-1][0] if after else hit_no
                pos = lo
                no = base + 1
                while len(after) < want and pos < n:
                    if no > covered:
                        f = block.find(b"\n", pos, n)
                        f = n if f < 0 else f
                        after.append([no, block[pos:f]])
                        pos = f + 1
                    else:
                        f = block.find(b"\n", pos, n)
                        pos = n if f < 0 else f + 1
                    no += 1
                if len(after) < want:
                    still.append((hit_no, after))
            self._pending_after = still
        keep = max(want, _HEADERLESS_LOOKBACK)
        tail: list[list[Any]] = []
        end = n - 1 if ends_nl else n
        no = base + nl_total + (0 if ends_nl else 1)
        while len(tail) < keep and end >= lo:
            b = block.rfind(b"\n", lo, end) + 1
            if b <= 0:
                b = lo
            tail.append([no, block[b:end]])
            no -= 1
            end = b - 1
        tail.reverse()
        if len(tail) < keep:
            tail = self._tail[-(keep - len(tail)) :] + tail
        self._tail = tail

    def _simple_milestones(
        self, block: bytes, lo: int, n: int, *, base: int, firsts: dict[int, int], nl_total: int
    ) -> None:
        c = self._c
        lasts = c.prefilter.last_offsets(block, list(firsts), lo, n)
        wanted: list[tuple[int, int, int]] = []  # (aid, first_off, last_off)
        offsets: set[int] = set()
        for aid, end in firsts.items():
            first_off = end - 1
            last_off = max(lasts.get(aid, -1), first_off)
            offsets.add(first_off)
            offsets.add(last_off)
            wanted.append((aid, first_off, last_off))
        # Line numbers: count newlines from whichever end of the block is nearer.
        line_at: dict[int, int] = {}
        ordered = sorted(offsets)
        mid = (lo + n) // 2
        front = [o for o in ordered if o < mid]
        back = [o for o in ordered if o >= mid]
        prev = lo
        seen = 0
        for off in front:
            seen += block.count(b"\n", prev, off)
            prev = off
            line_at[off] = base + seen + 1
        prev = n
        after = 0
        for off in reversed(back):
            after += block.count(b"\n", off, prev)
            prev = off
            line_at[off] = base + nl_total - after + 1
        for aid, f_off, l_off in wanted:
            for rule in c.ruleset.anchor_rules[aid]:
                if rule.stage:
                    self._stage_seen(rule.stage, line_at[f_off])
                    self._stage_seen(rule.stage, line_at[l_off])
                    if rule.marks in ("complete", "ready"):
                        self._stage_completed(rule.stage, line_at[f_off])
                    if rule.marks == "ready":
                        self._mark_ready(line_at[f_off])

    def _mark_ready(self, line_no: int) -> None:
        if self._ready_line is None or line_no < self._ready_line:
            self._ready_line = line_no

    def _stage_completed(self, stage: str, line_no: int) -> None:
        ev = self._evidence[stage]
        if ev.completed_at is None or line_no < ev.completed_at:
            ev.completed_at = line_no

    def _milestone(self, rule: Rule, line_no: int) -> None:
        # A requested stop is not evidence that its stage (serving) was reached.
        if rule.stage and rule.marks != "shutdown":
            self._stage_seen(rule.stage, line_no)
            if rule.marks in ("complete", "ready"):
                self._stage_completed(rule.stage, line_no)
        if rule.marks == "ready":
            self._mark_ready(line_no)
        if rule.marks == "shutdown" and self._shutdown_line is None:
            self._shutdown_line = line_no
        if rule.marks == "foreign_platform" and self._foreign_platform_line is None:
            self._foreign_platform_line = line_no

    def _stage_seen(self, stage: str, line_no: int) -> None:
        ev = self._evidence.get(stage)
        if ev is None:
            self._evidence[stage] = StageEvidence(line_no, line_no)
        else:
            ev.add(line_no)

    def _line(self, block: bytes, s: int, e: int, line_no: int, anchor_ids: list[int]) -> None:
        raw = block[s:e]
        if anchor_ids and not self._c.prefilter.exact_ids:
            anchor_ids = self._c.prefilter.line_anchor_ids(raw)
        line = self._parse(line_no, raw)
        line = self._tracker.feed(line)
        self._remember_prefix(raw, line)
        hints = self._c.hints
        if line.tb_role == "frame":
            if self._tracker.headerless_start(line):
                self._headerless_start(block, s, line)
            if len(self._hint_events) < MAX_HINTS:
                self._frame_hint(line_no, line.body, line.tb_chain, line.tb_index)
            return
        if line.tb_role in ("header", "separator"):
            return
        if self._interleaved is None:
            self._note_interleaved(line)
        if (
            anchor_ids
            and not self._c.hint_ids.isdisjoint(anchor_ids)
            and len(self._hint_events) < MAX_HINTS
        ):
            found = {self._c.hint_needles[a] for a in anchor_ids if a in self._c.hint_ids}
            st = hints.line_stage(line.body, found)
            if st is not None:
                self._hint_events.append(
                    HintEvent(line_no, st, line.tb_chain, line.tb_index, False)
                )
            cat = hints.line_category(line.body, found)
            if cat is not None and len(self._cat_events) < MAX_HINTS:
                self._cat_events.append(
                    HintEvent(line_no, cat, line.tb_chain, line.tb_index, False)
                )
        if not anchor_ids and line.tb_role not in ("exception", "detail"):
            return
        n_rule = self._c.n_rule_anchors
        ids = [a for a in anchor_ids if a < n_rule]
        hit = self._classify(line, ids)
        if hit is None:
            return
        rule = hit.rule
        if rule.kind == "noise":
            return
        if rule.kind == "milestone":
            self._milestone(rule, line_no)
            return
        if len(self._hits) >= MAX_HITS:
            self._hits_dropped += 1
            return
        if len(line.text) > MAX_KEPT_TEXT:
            # Keep memory bounded: a kept finding never holds more than this of its line.
            cut = f" …[{len(line.text) - MAX_KEPT_TEXT} more characters]"
            short = replace(
                line,
                text=line.text[:MAX_KEPT_TEXT] + cut,
                body=line.body[:MAX_KEPT_TEXT],
            )
            hit = replace(hit, line=short)
        self._hits.append(hit)
        if rule.marks == "message_tail" and len(self._above_tail) < MAX_CONTEXTS:
            self._remember_above(block, s, line_no)
        if self.context and rule.kind == "failure" and len(self._context) < MAX_CONTEXTS:
            ctx = _context_around(
                block, s, e, line_no=line_no, n=self.context, lo=self._lo, hi=self._hi
            )
            before = ctx["before"]
            if len(before) < self.context:
                older = [x for x in self._tail if x[0] < line_no - len(before)]
                before[:0] = older[-(self.context - len(before)) :]
            if len(ctx["after"]) < self.context:
                self._pending_after.append((line_no, ctx["after"]))
            self._context[line_no] = ctx

    def _remember_above(self, block: bytes, s: int, line_no: int) -> None:
        """Keep the raw line above a message tail (``marks = "message_tail"``): the first line
        of its message, the answer when no rule states a cause (:meth:`_message_above`)."""
        if s > self._lo:
            self._above_tail[line_no] = line_above(block, self._lo, s, _MAX_ABOVE)
            return
        for no, raw in reversed(self._tail):  # the block starts with the tail: the last block's
            if no == line_no - 1:
                self._above_tail[line_no] = bytes(raw[:_MAX_ABOVE])
            if no < line_no:
                return

    def _note_interleaved(self, line: LogLine) -> None:
        """Keep the first line that mixes several stack dumps' frame text (EXC012), unless
        its level says it is no error (a handled traceback escaped into a warning)."""
        if line.tb_role in (None, "exception") and line.level not in _NOT_ERRORS:
            self._interleaved = line if is_interleaved_frames(line.body) else None

    def _parse(self, line_no: int, raw: bytes) -> LogLine:
        """:func:`parse_line`, memoised on the raw bytes (a dense crash repeats whole lines,
        timestamps included, many times within one second)."""
        if len(raw) > _MEMO_LINE:
            return parse_line(line_no, raw)
        got = self._env_memo.get(raw)
        if got is None:
            got = parse_line(line_no, raw)  # remembered with its line number: a hit renumbers
            if len(self._env_memo) >= _MEMO_SIZE or self._env_memo_bytes >= _MEMO_BYTES:
                self._env_memo.clear()
                self._env_memo_bytes = 0
            self._env_memo[raw] = got
            self._env_memo_bytes += len(raw)
            return got
        return LogLine(
            line_no,
            got.text,
            got.body,
            got.process,
            got.pid,
            got.rank,
            got.level,
            got.timestamp,
            got.source_file,
            got.wrapper,
        )

    def _classify(self, line: LogLine, ids: list[int]) -> Classified | None:
        """The classifier, memoised on what it reads: crash loops and dense serving crashes
        print the same messages over and over, and pyparsing is the cost on those lines."""
        down = self._shutdown_line is not None
        body: object = line.body
        if len(line.body) > _MEMO_LINE:
            # Huge bodies (data dumps) are remembered by digest, not by value.
            body = hashlib.blake2b(line.body.encode("utf-8", "surrogatepass"), digest_size=16)
            body = (len(line.body), body.digest())
        key = (body, line.level, line.tb_role, tuple(ids), down)
        if key not in self._memo:
            hit = self._c.classifier.classify(line, ids, shutdown_requested=down)
            if len(self._memo) >= _MEMO_SIZE or self._memo_chars >= _MEMO_BYTES:
                self._memo.clear()
                self._memo_chars = 0
            self._memo[key] = None if hit is None else (hit.rule, hit.captures)
            self._memo_chars += min(len(line.body), _MEMO_LINE)
            return hit
        got = self._memo[key]
        if got is None:
            return None
        return Classified(rule=got[0], line=line, captures=dict(got[1]))

    def _frame_hint(self, line_no: int, body: str, chain: int | None, index: int) -> None:
        hints = self._c.hints
        st = hints.frame_stage(body)
        if st is not None:
            self._hint_events.append(HintEvent(line_no, st, chain, index, True))
        cat = hints.frame_category(body)
        if cat is not None and len(self._cat_events) < MAX_HINTS:
            self._cat_events.append(HintEvent(line_no, cat, chain, index, True))

    # -- the frame-run fast path ------------------------------------------------------------

    def _remember_prefix(self, raw: bytes, line: LogLine) -> None:
        """After a traceback header or frame line whose envelope is a plain byte prefix of the
        line, the following lines of the same process with the same envelope (any timestamp)
        and an indented body are frames of the same traceback."""
        if line.tb_role not in ("frame", "header") or not line.text.endswith(line.body):
            self._run_shape = None
            return
        text_pfx = line.text[: len(line.text) - len(line.body)]
        got = self._pfx_memo.get(text_pfx)
        if got is None:
            pfx = text_pfx.encode("utf-8", "surrogateescape")
            ts = line.timestamp.encode("utf-8", "surrogateescape") if line.timestamp else None
            got = _envelope_shape(pfx, ts, self._shape_memo)
            if len(self._pfx_memo) >= _MEMO_SIZE:
                self._pfx_memo.clear()
            self._pfx_memo[text_pfx] = got
        if not raw.startswith(got.gate) or raw.startswith(b'{"log":'):
            self._run_shape = None
            return
        self._run_shape = got
        self._run_key = line.key

    def _headerless_start(self, block: bytes, s: int, first: LogLine) -> None:
        """A traceback whose header the log lacks starts at frame ``first`` (at ``block[s]``):
        the source and caret lines of the same process just above it (an excerpt that begins
        inside the frames keeps them) are its start, for a log that ends inside it (EXC011)."""
        start = None
        pos = s
        earlier: dict[int, Any] | None = None  # the previous blocks' last lines, when needed
        for back in range(1, _HEADERLESS_LOOKBACK + 1):
            no = first.line_no - back
            if pos > self._lo:
                b = block.rfind(b"\n", self._lo, pos - 1) + 1
                raw = block[b : pos - 1]
                pos = b
            else:
                earlier = dict(self._tail) if earlier is None else earlier
                if no not in earlier:
                    break
                raw = earlier[no]
            prev = self._parse(no, bytes(raw))
            body = prev.body
            if prev.key != first.key or not body.strip() or body[0] not in " \t":
                break
            start = prev
        if start is not None:
            self._tracker.start_earlier(start)

    def _try_frame_run(self, block: bytes, pos: int, n: int, line_no: int) -> int:
        """The end of a frame run at ``pos`` (``pos`` when there is none to take)."""
        shape = self._run_shape
        if not FRAME_RUNS or shape is None or pos == self._run_stop:
            return pos
        if not block.startswith(shape.gate, pos):
            return pos
        self._run_stop = self._frame_run(block, pos, n, line_no)
        return self._run_stop

    def _frame_run(self, block: bytes, pos: int, n: int, line_no: int) -> int:
        """Consume, at C speed, the run of frame lines starting at ``pos`` (same envelope,
        indented body, nothing the envelope parser would treat specially); return the offset
        after it (``pos`` when there is none). Frame hints in the run are recorded."""
        shape = self._run_shape
        assert shape is not None
        st = self._tracker.frames_open(self._run_key)
        if st is None:
            return pos
        rx = self._run_res.get(shape.first)
        if rx is None:
            if len(self._run_res) >= _MAX_RUN_PATTERNS:
                self._run_res.clear()
            rx = self._run_res[shape.first] = re.compile(
                shape.first + _RUN_BODY + b"(?:" + shape.repeat + _RUN_BODY + b")*"
            )
        m = rx.match(block, pos, n)
        if m is None or m.groups() != shape.expect:
            return pos  # another process's line (or none): the slow path decides
        end = m.end()
        if shape.plen:
            lines = block[pos:end].split(b"\n")[:-1]
            # Every line of the run has the same envelope length (same numbers, fixed-width
            # clock).
            bodies = b"\n".join([ln[shape.plen :] for ln in lines])
        else:  # no envelope (a bare traceback): the lines are the bodies
            bodies = block[pos : end - 1]
        run = self._run_of(bodies, st.frame_indent)
        if run.cut == 0:
            return pos
        if run.frame_indent is not None:
            st.frame_indent = run.frame_indent
        st.bare_source = 0  # the run's lines were indented
        self._run_hints(run.hints, line_no, st)
        st.last_seen = line_no + run.cut
        if run.cut > bodies.count(b"\n"):
            return end  # the whole run
        return pos + len(b"\n".join(block[pos:end].split(b"\n")[: run.cut])) + 1

    def _run_of(self, bodies: bytes, frame_indent: int | None) -> _Run:
        """What a run of frame lines whose bodies (envelopes removed, one per line) are
        ``bodies`` amounts to, after a frame indented ``frame_indent``: remembered per bodies
        and indent, so a traceback repeated by a crash loop is looked at once."""
        key = (bodies, frame_indent)
        got = self._runs_memo.get(key)
        if got is None:
            cut = _run_cut(bodies, frame_indent)
            if cut <= bodies.count(b"\n"):
                bodies = b"\n".join(bodies.split(b"\n")[:cut])
            got = _Run(cut, _last_frame_indent(bodies, len(bodies)), self._hints_of(bodies))
            if len(key[0]) <= _MEMO_RUN:
                if len(self._runs_memo) >= _MEMO_RUNS:
                    self._runs_memo.clear()
                self._runs_memo[key] = got
        return got

    def _run_hints(
        self, hints: tuple[tuple[int, str | None, str | None], ...], line_no: int,
        st: TracebackState,
    ) -> None:
        """Record the frame hints of a run (see :meth:`_hints_of`) whose first line is
        ``line_no + 1``; the hint functions decided, exactly as on the slow path."""
        for idx, stage, cat in hints:
            if stage is not None and len(self._hint_events) < MAX_HINTS:
                ev = HintEvent(line_no + 1 + idx, stage, st.chain, st.index, True)
                self._hint_events.append(ev)
            if cat is not None and len(self._cat_events) < MAX_HINTS:
                ev = HintEvent(line_no + 1 + idx, cat, st.chain, st.index, True)
                self._cat_events.append(ev)

    def _hints_of(self, bodies: bytes) -> tuple[tuple[int, str | None, str | None], ...]:
        """(line index, stage, category) of each frame line of a run that some hint names."""
        c = self._c
        out: list[tuple[int, str | None, str | None]] = []
        for i, raw in enumerate(bodies.split(b"\n")):
            m = _FRAME_FUNC.search(raw)
            if not (m and m.group(1) in c.frame_funcs) and not any(x in raw for x in c.frame_subs):
                continue
            body = decode_line(raw)
            stage, cat = c.hints.frame_stage(body), c.hints.frame_category(body)
            if stage is not None or cat is not None:
                out.append((i, stage, cat))
        return tuple(out)


# Bytes forms of the tracker's frame and indented-exception shapes (grammar._ANY_FRAME_RE,
# grammar.INDENTED_EXC_RE), per line of a run's bodies. The exception shape is a superset (any
# non-ASCII byte may be a word character): a candidate only hands its line to the slow path.
_RUN_FRAME = re.compile(rb'^([ \t]*)File "[^"\n]*", line [0-9]+', re.M)
# Searched from each newline (a literal start: several times faster than a MULTILINE "^");
# the first line is matched on its own. Possessive: a line that fails is given up at once.
_EXC_TAIL = (
    rb"([ \t]++)(?:[A-Za-z_\x80-\xff][\w\x80-\xff]*+\.)*+[A-Z][\w\x80-\xff]*+"
    rb"(?::(?:[ \t]|$)|$)"
)
_RUN_EXC_FIRST = re.compile(_EXC_TAIL, re.M)
_RUN_EXC = re.compile(rb"\n" + _EXC_TAIL, re.M)


def _last_frame_indent(bodies: bytes, end: int) -> int | None:
    """Indentation of the last frame line starting before ``end`` in ``bodies``."""
    while end > 0:
        at = bodies.rfind(b'File "', 0, end)
        if at < 0:
            return None
        start = bodies.rfind(b"\n", 0, at) + 1
        m = _RUN_FRAME.match(bodies, start)
        if m is not None and m.end(1) == at:
            return at - start
        end = at
    return None


def _exception_cut(bodies: bytes, frame_indent: int | None) -> int:
    """The index of the first body line that may end the frames as a re-indented exception
    line (grammar.ends_frames), else the number of lines; the slow path decides there."""
    first = _RUN_EXC_FIRST.match(bodies)
    fits = frame_indent or 1  # one blank deeper under flush-left frames (grammar.ends_frames)
    if first is not None and frame_indent is not None and len(first.group(1)) <= fits:
        return 0
    for m in _RUN_EXC.finditer(bodies):
        start = m.start(1)  # the line's first byte
        fi = _last_frame_indent(bodies, start)
        fi = frame_indent if fi is None else fi
        if fi is not None and len(m.group(1)) <= (fi or 1):  # grammar.ends_frames
            return bodies.count(b"\n", 0, start)
    return bodies.count(b"\n") + 1


# One Hyperscan pass for _run_cut: every stop (first occurrence) and every line shaped like an
# indented exception line (a superset of _RUN_EXC: no possessive quantifiers there).
_HS_EXC = (
    rb"^[ \t]+(?:[A-Za-z_\x80-\xff][\w\x80-\xff]*\.)*[A-Z][\w\x80-\xff]*(?::(?:[ \t]|$)|$)"
)
_RUN_SCAN: list[Any] = []  # [database, scratch] once built; [None, None] without Hyperscan


def _run_scanner() -> list[Any]:
    if not _RUN_SCAN:
        try:
            import hyperscan

            db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            # Every byte hex-escaped: the expressions are C strings (a NUL would end one).
            exprs = [b"".join(b"\\x%02x" % c for c in stop) for stop in _RUN_STOPS]
            exprs.append(_HS_EXC)
            flags = [hyperscan.HS_FLAG_SINGLEMATCH] * len(_RUN_STOPS)
            flags.append(hyperscan.HS_FLAG_MULTILINE)
            db.compile(
                expressions=exprs, ids=list(range(len(exprs))), elements=len(exprs), flags=flags
            )
            _RUN_SCAN[:] = [db, hyperscan.Scratch(db)]
        except Exception:  # Hyperscan missing or unusable: the bytes.find path below
            _RUN_SCAN[:] = [None, None]
    return _RUN_SCAN


def _run_cut(bodies: bytes, frame_indent: int | None) -> int:
    """``min(_first_special(bodies), _exception_cut(bodies, frame_indent))``: where a frame run
    must stop. With Hyperscan one pass finds the stops and the exception-shaped lines (the
    seven ``bytes.find`` and the regex were a tenth of a dense crash's time)."""
    db, scratch = _run_scanner()
    if db is None:
        return min(_first_special(bodies), _exception_cut(bodies, frame_indent))
    n_stops = len(_RUN_STOPS)
    stops: list[int] = []
    cands: list[int] = []

    def on_match(aid: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
        (stops if aid < n_stops else cands).append(end)

    db.scan(bodies, match_event_handler=on_match, scratch=scratch)
    # A stop holds no newline: the line of its end is its line.
    cut = bodies.count(b"\n", 0, min(stops)) if stops else bodies.count(b"\n") + 1
    for end in sorted(cands):
        start = bodies.rfind(b"\n", 0, end) + 1
        line = bodies.count(b"\n", 0, start)
        if line >= cut:
            break
        m = _RUN_EXC_FIRST.match(bodies, start)
        if m is None:
            continue
        fi = _last_frame_indent(bodies, start)
        fi = frame_indent if fi is None else fi
        if fi is not None and len(m.group(1)) <= (fi or 1):  # grammar.ends_frames
            cut = line
            break
    return _bare_cr_cut(bodies, cut)


def _first_special(bodies: bytes) -> int:
    """The index of the first body line the envelope parser or the tracker would treat
    specially (see _RUN_STOPS; a bare CR), else the number of lines."""
    cut = bodies.count(b"\n") + 1
    for stop in _RUN_STOPS:
        at = bodies.find(stop)
        if at >= 0:
            cut = min(cut, bodies.count(b"\n", 0, at))
    return _bare_cr_cut(bodies, cut)


def _bare_cr_cut(bodies: bytes, cut: int) -> int:
    """``cut``, or the index of an earlier line holding a bare CR."""
    cr = bodies.count(b"\r")
    if cr:
        closed = bodies + b"\n"  # each line's own CR (CRLF logs) is followed by a newline
        if cr != closed.count(b"\r\n"):
            bare = _BARE_CR.search(closed)
            if bare is not None:
                cut = min(cut, bodies.count(b"\n", 0, bare.start()))
    return cut


def _split_hits(
    hits: Iterable[tuple[int, int]], single: Sequence[bool]
) -> tuple[dict[int, int], list[tuple[int, int]]]:
    """(first hit of each anchor-only milestone, every other hit): of anchor-only milestones
    only the first and last line per block matter."""
    firsts: dict[int, int] = {}
    others: list[tuple[int, int]] = []
    for end, aid in hits:
        if single[aid]:
            if aid not in firsts:
                firsts[aid] = end
        else:
            others.append((end, aid))
    return firsts, others


def _context_around(
    block: bytes, s: int, e: int, *, line_no: int, n: int, lo: int, hi: int
) -> dict[str, list[list[Any]]]:
    """Up to ``n`` lines before and after the line ``block[s:e]`` (within ``block[lo:hi]``),
    raw: only the first failure's are decoded (:meth:`AnalysisEngine.finish`)."""
    before: list[list[Any]] = []
    pos = s
    for i in range(1, n + 1):
        if pos <= lo:
            break
        b = block.rfind(b"\n", lo, pos - 1) + 1
        if b <= 0:
            b = lo
        before.append([line_no - i, block[b : pos - 1]])
        pos = b
    before.reverse()
    after: list[list[Any]] = []
    pos = e + 1
    for i in range(1, n + 1):
        if pos >= hi:
            break
        f = block.find(b"\n", pos, hi)
        if f < 0:
            f = hi
        after.append([line_no + i, block[pos:f]])
        pos = f + 1
    return {"before": before, "after": after}


# -- sources -------------------------------------------------------------------------------


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def _is_tar(path: Path) -> bool:
    name = path.name.lower()
    if name.endswith(BUNDLE_SUFFIXES):
        return True
    if not _is_regular(path):
        return False  # a FIFO or device: probing would consume what it delivers
    try:
        with open(path, "rb") as probe:
            head = probe.read(512)
        if not head.strip(b"\0"):
            return False  # zero bytes first (a log after a crash), not a tar header
        return tarfile.is_tarfile(path)
    except (OSError, EOFError, tarfile.TarError, zlib.error):
        return False


def _bundle_log_stream(path: Path) -> Iterator[bytes]:
    """Stream ``logs/combined.log`` out of a bundle without extracting it (through the bundle
    reader, so every safety and hash check applies)."""
    with open_bundle(path) as b:
        stream = b.open_member(_LOG_MEMBER)
        try:
            yield from _read_blocks(stream)
        finally:
            stream.close()


# Logs copied from web pages (envelope.WEB_CHARS): anchors, frames and the envelope grammar
# expect ASCII blanks and quotes, so a block holding any of those characters is rewritten once
# (a line may shrink; line numbers are unchanged).
_WEB_BLANKS = tuple((old.encode(), new.encode()) for old, new in WEB_CHARS.items())
_WEB_SCAN: list[LiteralScanner] = []  # [scanner] once built


def _web_scanner() -> LiteralScanner:
    """The WEB_CHARS sequences, each reported once: a C-level scan that stops at the first
    (``bytes.find`` of a multi-byte needle runs at ~1 GB/s, a tenth of a dense log's time)."""
    if not _WEB_SCAN:
        olds = [old for old, _ in _WEB_BLANKS]
        _WEB_SCAN.append(LiteralScanner(olds, single=[True] * len(olds)).prepare())
    return _WEB_SCAN[0]


def _plain_blanks(seg: bytes) -> bytes:
    for old, new in _WEB_BLANKS:
        if old in seg:
            seg = seg.replace(old, new)
    return seg


def _read_blocks(fh: IO[bytes] | Any) -> Iterator[bytes]:
    while True:
        try:
            chunk = fh.read(BLOCK_SIZE)
        except (OSError, EOFError, tarfile.TarError) as err:
            raise InputError(f"read error while analysing ({err})") from None
        if not chunk:
            return
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8", errors="replace")
        yield chunk


def _file_blocks(path: Path) -> Iterator[bytes]:
    magic = b""
    if _is_regular(path):
        try:
            with open(path, "rb") as probe:
                magic = probe.read(2)
        except OSError:
            magic = b""
    if magic == b"\x1f\x8b":  # a gzip-compressed plain log (server.log.gz)
        try:
            with gzip.open(path, "rb") as gz:
                yield from _read_blocks(gz)
        except (OSError, EOFError, zlib.error) as err:
            raise InputError(f"{path}: corrupt gzip log ({err}); check the file") from None
        return
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the with-block below
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; give a bundle (.tar/.tar.gz) or a log") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory; give a bundle file or a log file") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror})") from None
    with fh:
        try:
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        yield from _read_blocks(fh)


def _iter_lines_as_blocks(lines: Iterable[str | bytes]) -> Iterator[bytes]:
    buf: list[bytes] = []
    size = 0
    for ln in lines:
        b = ln.encode("utf-8", errors="surrogateescape") if isinstance(ln, str) else bytes(ln)
        if not b.endswith(b"\n"):
            b += b"\n"
        buf.append(b)
        size += len(b)
        if size >= BLOCK_SIZE:
            yield b"".join(buf)
            buf.clear()
            size = 0
    if buf:
        yield b"".join(buf)


_UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)


def utf16_as_utf8(blocks: Iterator[bytes]) -> Iterator[bytes]:
    """The blocks as they are, or, for a log that starts with a UTF-16 byte-order mark (Windows
    PowerShell's ``>`` and ``Tee-Object`` write UTF-16LE), decoded and re-encoded as UTF-8 on
    the fly. Line numbers do not change: every ``\n`` is one line end in both encodings."""
    first = b""
    for first in blocks:
        if first:
            break
    if not first.startswith(_UTF16_BOMS):
        if first:
            yield first
        yield from blocks
        return
    dec = codecs.getincrementaldecoder("utf-16")(errors="replace")
    yield dec.decode(first).encode("utf-8", errors="surrogateescape")
    for block in blocks:
        yield dec.decode(block).encode("utf-8", errors="surrogateescape")
    yield dec.decode(b"", final=True).encode("utf-8", errors="surrogateescape")


def _blocks_for(source: object) -> tuple[str, Iterator[bytes]]:
    if isinstance(source, str) and "\n" in source:
        # Log text, not a path: no file name holds a newline in practice.
        return "<text>", iter([source.encode("utf-8", errors="surrogateescape")])
    if isinstance(source, str | os.PathLike):
        s = os.fspath(source)
        if isinstance(s, bytes):
            s = s.decode("utf-8", errors="replace")
        if s == "-":
            return "-", _read_blocks(sys.stdin.buffer)
        path = Path(s)
        shown = s if len(s) <= 200 else s[:199] + "…"
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            raise InputError(
                f"{shown}: no such file; give a bundle (.tar/.tar.gz) or a log file"
            ) from None
        except OSError as err:  # a path too long, a loop of links, no permission
            raise InputError(f"{shown}: cannot read ({err.strerror})") from None
        if stat.S_ISDIR(mode):
            raise InputError(f"{shown}: is a directory; give a bundle file or a log file")
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            # /dev/zero never ends and holds no log: refuse rather than read forever.
            raise InputError(
                f"{shown}: is a device, not a log; give a file, or '-' to read a stream"
            )
        if _is_tar(path):
            return s, _bundle_log_stream(path)
        return s, _file_blocks(path)
    if isinstance(source, bytes | bytearray | memoryview):
        return "<bytes>", iter([bytes(source)])
    if hasattr(source, "read"):
        name = getattr(source, "name", None)
        label = name if isinstance(name, str) else "<stream>"
        if isinstance(source, io.TextIOBase):
            return label, _read_blocks(source)
        return label, _read_blocks(source)
    if isinstance(source, Iterable):
        return "<lines>", _iter_lines_as_blocks(source)
    raise InputError(
        f"cannot analyse a {type(source).__name__}; give a path, '-', a binary file or lines"
    )


def analyze(
    source: object,
    *,
    ruleset: RuleSet | None = None,
    label: str | None = None,
    engine: str | None = None,
    context: int = 3,
    stall_inputs: StallInputs | None = None,
    budget: Budget | None = None,
    stopped: bool = False,
) -> Analysis:
    """Analyse a bundle path (.tar/.tar.gz/.tgz), a log path, ``"-"`` (stdin), log text (a
    ``str`` holding a newline), a binary file object, raw bytes, or an iterable of
    ``str``/``bytes`` lines.

    Raises :class:`~kk3evidence.errors.InputError` (or ``BundleError``) for unreadable input;
    never a traceback for the content of a log. ``stall_inputs`` (a capture in progress) or a
    bundle's own members add stage durations and stall snapshots (:mod:`.hang`).
    ``budget`` bounds what is read and analysed (:mod:`.budget`); the result then says what
    it covered in ``coverage``. ``stopped``: the caller knows the run is over where the log
    ends (a plain log then gets the stall verdict of SPEC §2 as a bundle would).
    """
    name, blocks = _blocks_for(source)
    blocks = utf16_as_utf8(blocks)
    eng = AnalysisEngine(label or name, ruleset, engine=engine, context=context)
    scan = HeldHangScan()  # scanned only as far as the verdict needs (see HeldHangScan)
    inputs = stall_inputs or bundle_stall_inputs(source)
    if stopped:
        inputs = replace(inputs or StallInputs(), stopped=True)
    if budget is not None:
        return _analyze_budgeted(blocks, budget, eng, scan, stall_inputs=inputs)
    for raw in blocks:
        block = eng.plain(raw)
        eng.feed(block)
        scan.feed(block)
    return apply_hang(eng.finish(), scan, inputs)


def _analyze_budgeted(
    blocks: Iterator[bytes], budget: Budget, eng: AnalysisEngine, scan: HangScan,
    *, stall_inputs: StallInputs | None,
) -> Analysis:
    """:func:`analyze` within ``budget``; the result carries its coverage (issue 16)."""
    pieces, tally = budgeted(blocks, budget)
    for piece in pieces:
        if piece.kind == "skip":
            eng.skip_lines(piece.lines)
            scan.skip_lines(piece.lines)
            continue
        data = eng.plain(piece.data)
        eng.feed(data)
        scan.feed(data)
    result = apply_hang(eng.finish(), scan, stall_inputs)
    cov = coverage(tally, budget)
    # Only a partial analysis says so: a whole one looks exactly as without a budget.
    return result if cov.complete else replace(result, coverage=cov.to_json())
