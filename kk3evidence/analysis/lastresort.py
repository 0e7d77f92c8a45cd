"""The last resort: an ERROR-level line when nothing else in the log states a failure.

Blind sets 5 and 6 (``corpus/HELDOUT5.md``, ``HELDOUT6.md``) had a quarter of their failing
logs answered "no failure": the line that said what went wrong was an ERROR-level message that
no rule knew and that is not a Python exception line (``Error in chat_completion_full_generator
…``, a Ray core worker's ``[… E pid tid] core_worker.cc: …``, Python-logging-format vLLM lines,
an accelerator runtime's ``[ERROR]`` or ``|CCL_ERROR|`` report). The log itself had flagged the
line; the analyzer had not looked at it, because no anchor of any rule was in it.

:class:`ErrorLineCollector` runs beside the block scan and keeps the first
:data:`MAX_LINES` lines that carry an error-level token anywhere (one multi-literal scan over
the block: nothing is decoded or parsed then). Only when the analysis found no failure at all
does :func:`last_resort` look at them: the first one whose envelope (or prefix) says ERROR /
CRITICAL / FATAL, that is not part of a traceback, not noise, not after a requested shutdown,
is reported through rule ``EXC010`` (``rules/fallback.toml``, evidence 5, the weakest), so it
gets the stage in progress, the category hints and the ``basis = "fallback"`` of every other
fallback. A log that flags nothing stays clean, and a log with any stated failure is not
changed at all.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from kk3evidence._literals import LiteralScanner
from kk3evidence.analysis.classify import Classified, Classifier
from kk3evidence.analysis.grammar import LogLine, is_filler, parse_line

__all__ = [
    "CUT_RULE_ID",
    "INTERLEAVED_RULE_ID",
    "MAX_LINES",
    "RULE_ID",
    "ErrorLineCollector",
    "continued_record",
    "cut_traceback",
    "interleaved_dump",
    "is_error_level",
    "is_message",
    "last_resort",
    "line_above",
]

RULE_ID = "EXC010"
CUT_RULE_ID = "EXC011"  # a traceback the log ends in, before its exception line
INTERLEAVED_RULE_ID = "EXC012"  # stack-dump text of several processes mixed within lines
MAX_LINES = 256  # candidate lines kept (then the collector stops scanning: cost bounded)
_MAX_KEPT = 8192  # bytes of a candidate line kept
_WINDOW = 1 << 20  # scanned per call, cut at a newline, so a full collector stops early
_FIRST_WINDOW = 1 << 16  # the first call's (doubled up to _WINDOW: a dense crash fills it soon)

#: Literal tokens of error-level lines (a candidate has one somewhere; the level test below
#: decides whether it is in the line's prefix).
_TOKENS = (
    b"ERROR",
    b"ERRR",
    b"CRITICAL",
    b"FATAL",
    b" E ",
    b"[E",
    b"\nE0",
    b"\nE1",
    b"\nE2",
    b"\nF0",
    b"\nF1",
    b"\nF2",
    b"level=error",
    b"level=fatal",
    b"level=ERROR",
    b"level=FATAL",
    b" [error] ",
    b" [critical] ",
    b" [crit] ",
    b" [alert] ",
    b" [emerg] ",
    *(
        f'"{key}":{sp}"{lv}"'.encode()
        for key in ("level", "severity")
        for sp in ("", " ")
        for lv in ("error", "fatal", "critical", "ERROR", "FATAL", "CRITICAL")
    ),
)  # (`\nE0`…: a glog line `E1201 10:00:00 …` / `E20260608 …` after the first line)

# Error levels the envelope parser does not peel (it knows vLLM's, Python logging's, torchrun's
# and bracketed `[ERROR]`): Ray core `[date time,ms E pid tid]`, glog/c10d `[E1201 …` or
# `E1201 10:00:00` (c10d writes the month without a leading zero: `[E822 …`; Ascend's glog
# the year: `E20260608`), a level word among the first few fields, after blanks too (`[ts]
# ERROR …`, `ts ERROR: …`; IBM Spyre's runtime writes ` ERRR`), oneCCL's `|CCL_ERROR|`, logfmt
# `level=error` (Go's slog: `level=ERROR`), nginx's error log (`2025/06/01 10:00:00 [error] 7#7:
# …`, also `[crit]`, `[alert]`, `[emerg]`), a JSON record's `"level":"error"` or
# `"severity":"ERROR"` (zap, logrus, structlog: controllers and gateways beside vLLM). spdlog's
# `[logger] [error]` is peeled by the envelope (format `spdlog`).
_LEVEL_TEXT = re.compile(
    r"""^(?:
        \[[^\]\n]{0,48}\s[EF]\s\d+\s\d+\]
      | (?:\[rank\d+\]:)?\[[EF]\d{3,8}\s
      | [EF]\d{3,8}\s\d\d:\d\d:\d\d
      | \s*(?:\S+\s+){0,3}\[?(?:ERROR|ERRR|CRITICAL|FATAL)\]?(?=[\s:|\-]|$)
      | .{0,96}?\|(?:[A-Z]+_)?(?:ERROR|FATAL)\|
      | .{0,96}?(?<![\w-])level=(?:error|fatal|ERROR|FATAL)\b
      | (?:\S+\s+){1,3}\[(?:error|crit|alert|emerg)\]\s
      | \{.{0,200}?"(?:level|severity)":\s?"(?:error|fatal|critical|ERROR|FATAL|CRITICAL)"
    )""",
    re.X,
)
_SOURCE_STARTS = ("raise ", "return ", "Dumping ")
_CODE_ENDS = ("(", "[", "{", ",", "\\")  # a source line that goes on (`x = self.rpc(`)
_FRAME_TEXT = re.compile(r'File "[^"\n]+", line \d+')
# a repr of an object with fields (a data record, not a message): `SchedulerStats(num_running=`
_DATA_RECORD = re.compile(r"\b[A-Z][A-Za-z0-9_]*\([a-z_][a-z0-9_]*=")
_EMPTY_RECORD_END = (b"ERROR", b"CRITICAL", b"FATAL", b"[ERROR]")
_GLOG_FIRST = re.compile(rb"[EF]\d{3,8}\s")  # a glog error as the log's first line (no "\n")
_ERROR_LEVELS = frozenset({"ERROR", "CRITICAL"})
# Bodies that belong to a traceback (its header, frames, echoed source, carets, chain notes).
_TRACEBACK_BODY = (
    "Traceback (most recent call last)",
    'File "',
    "^",
    "~",
    "During handling of the above exception",
    "The above exception was the direct cause",
    "[repeated",
    "╭",
    "│",
    "╰",
)

_SCANNER: list[LiteralScanner] = []


def _scanner() -> LiteralScanner:
    if not _SCANNER:
        _SCANNER.append(LiteralScanner(_TOKENS).prepare())
    return _SCANNER[0].clone()


def is_error_level(line: LogLine) -> bool:
    """The line's own level is an error: its envelope says ERROR/CRITICAL, or (no envelope
    level) its prefix, or that of its body (after a process prefix such as Ray's
    `(WorkerDict pid=1)`), carries an error token (:data:`_LEVEL_TEXT`)."""
    if line.level is not None:
        return line.level in _ERROR_LEVELS
    return _LEVEL_TEXT.match(line.text) is not None or (
        line.body is not line.text and _LEVEL_TEXT.match(line.body) is not None
    )


def line_above(block: bytes, lo: int, s: int, limit: int) -> bytes:
    """The raw line (at most ``limit`` bytes) that ends right before ``block[s]``, the start of
    a line after ``lo`` (``s > lo``): what the last resort and the message-tail look-back read."""
    b = max(lo, block.rfind(b"\n", lo, s - 1) + 1)
    return bytes(block[b : min(s - 1, b + limit)])


class ErrorLineCollector:
    """The first :data:`MAX_LINES` lines holding an error-level token, as ``(line_no, raw)``."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, bytes]] = []
        #: the line above a candidate whose record looks empty (``… - ERROR - ``), by the
        #: candidate's number: a program that printed its message raw, then logged an empty
        #: error record (:func:`last_resort` answers with the message)
        self.above: dict[int, bytes] = {}
        self._scan: LiteralScanner | None = None

    @property
    def full(self) -> bool:
        return len(self.lines) >= MAX_LINES

    def scan(self, block: bytes, lo: int, n: int, base: int) -> None:
        """Look at the whole lines of ``block[lo:n]``; ``base`` lines came before them."""
        if self.full or n <= lo:
            return
        scanner = self._scan
        if scanner is None:
            scanner = self._scan = _scanner()
        counted, line_no, taken = lo, base, lo  # newlines counted up to `counted`
        if base == 0 and _GLOG_FIRST.match(block, lo):
            e = block.find(b"\n", lo, n)
            taken = n if e < 0 else e
            self.lines.append((1, bytes(block[lo : min(taken, lo + _MAX_KEPT)])))
        w = lo
        window = _FIRST_WINDOW
        while w < n:
            hi = n if n - w <= window else block.rfind(b"\n", w, w + window) + 1
            if hi <= w:
                hi = min(n, w + window)
            window = min(2 * window, _WINDOW)
            # (from the newline before the window: the `\nE0`-style tokens start with it)
            for end, _aid in scanner.hits(block, w - 1 if w > lo else w, hi):
                if end <= taken:
                    continue  # a second token on a line already taken
                s = max(lo, block.rfind(b"\n", lo, end) + 1)
                e = block.find(b"\n", end, n)
                e = n if e < 0 else e
                line_no += block.count(b"\n", counted, s)
                counted = s
                raw = bytes(block[s : min(e, s + _MAX_KEPT)])
                self.lines.append((line_no + 1, raw))
                if s > lo and raw.rstrip(b" \t\r-:|").endswith(_EMPTY_RECORD_END):
                    self.above[line_no + 1] = line_above(block, lo, s, _MAX_KEPT)
                taken = e
                if len(self.lines) >= MAX_LINES:
                    return
            w = hi


def last_resort(
    lines: list[tuple[int, bytes]],
    classifier: Classifier,
    *,
    shutdown_line: int | None,
    parse: Callable[[int, bytes], LogLine] = parse_line,
    above: dict[int, bytes] | None = None,
) -> Classified | None:
    """The first candidate that states a failure on its own level (see the module doc); an
    error record with an empty message answers with the plain line above it (``above``, from
    :attr:`ErrorLineCollector.above`) when that line is a message of its own."""
    rule = classifier.ruleset.get(RULE_ID)
    if rule is None:  # a rule set without the last resort (a user's own rules)
        return None
    for line in _before_stop(lines, shutdown_line, parse):
        body = line.body
        if not body.strip() and above and line.line_no in above and is_error_level(line):
            message = _plain_message(parse(line.line_no - 1, above[line.line_no]))
            if message is not None:
                return Classified(rule=rule, line=message)
        if not body.strip() or body.startswith(_TRACEBACK_BODY) or _continuation(body):
            continue
        if not is_error_level(line):
            continue
        hit = classifier.classify(line, shutdown_requested=False)
        if hit is not None:
            if hit.rule.kind == "failure":
                return hit
            continue  # noise, a milestone or a consequence: the rules know it is not a cause
        return Classified(rule=rule, line=line)
    return None


def _plain_message(line: LogLine) -> LogLine | None:
    """``line`` when it is a plain message: no envelope level, words, not a traceback's."""
    return line if line.level is None and is_message(line) else None


def is_message(line: LogLine) -> bool:
    """The line's body says something of its own: words, not a traceback's header, frame,
    source or caret line (echoed source such as `raise RuntimeError(`, a frame behind a broken
    envelope), not the indented or data-only continuation of a record, not a data record
    (`SchedulerStats(num_running_reqs=0, …)`, vLLM's `Dumping scheduler stats: …`)."""
    body = line.body
    if not body.strip() or body.startswith(_TRACEBACK_BODY) or line.tb_role == "frame":
        return False
    if _continuation(body) or is_filler(body) or body.startswith(_SOURCE_STARTS):
        return False
    if body.rstrip().endswith(_CODE_ENDS) or _FRAME_TEXT.search(body[:512]) is not None:
        return False
    return _DATA_RECORD.search(body[:160]) is None


def continued_record(
    lines: list[tuple[int, bytes]],
    classifier: Classifier,
    *,
    shutdown_line: int | None,
    parse: Callable[[int, bytes], LogLine] = parse_line,
) -> Classified | None:
    """The earliest line of a multi-line record logged at ERROR whose first line the log does
    not show (an excerpt that begins inside it, e.g. the tail of vLLM's ``dump_input`` block):
    indented or data-only bodies at level ERROR/CRITICAL. Asked only when neither
    :func:`last_resort` nor :func:`cut_traceback` answered (a traceback's frames are the
    cut traceback's, with their hints)."""
    rule = classifier.ruleset.get(RULE_ID)
    if rule is None:
        return None
    found: Classified | None = None
    for line in _before_stop(lines, shutdown_line, parse):
        stripped = line.body.strip()
        if stripped.startswith(_TRACEBACK_BODY):
            return None  # the indented lines are a traceback's, and it was not cut
        if found is None and stripped and line.level in _ERROR_LEVELS and _continuation(
            line.body
        ):
            found = Classified(rule=rule, line=line)
    return found


def _before_stop(
    lines: list[tuple[int, bytes]],
    shutdown_line: int | None,
    parse: Callable[[int, bytes], LogLine],
) -> Iterator[LogLine]:
    """The candidate lines up to a requested shutdown, parsed."""
    for no, raw in lines:
        if shutdown_line is not None and no > shutdown_line:
            return
        yield parse(no, raw)


def _continuation(body: str) -> bool:
    """A body that continues a multi-line record: indented (unless a level word follows the
    blanks: ` ERRR 24.01.2026 …` aligns its level with `INFO `), or hardly any words (data)."""
    if body[:1].isspace():
        return _LEVEL_TEXT.match(body) is None
    return sum(ch.isalpha() for ch in body[:64]) < 3


def cut_traceback(
    headers: list[LogLine], classifier: Classifier, *, shutdown_line: int | None
) -> Classified | None:
    """The earliest traceback the log ends in before its exception line came (rule
    ``EXC011``): the log was cut (a killed capture, a pasted excerpt) while the process was
    printing why it failed, so the header is the first statement of a failure there is."""
    rule = classifier.ruleset.get(CUT_RULE_ID)
    if rule is None:
        return None
    for line in sorted(headers, key=lambda ln: ln.line_no):
        if shutdown_line is None or line.line_no < shutdown_line:
            return Classified(rule=rule, line=line)
    return None


def interleaved_dump(
    line: LogLine | None, classifier: Classifier, *, shutdown_line: int | None
) -> Classified | None:
    """The first line that mixes frame text of several stack dumps (rule ``EXC012``; see
    :func:`~.grammar.is_interleaved_frames`), when it came before any requested shutdown."""
    rule = classifier.ruleset.get(INTERLEAVED_RULE_ID)
    if rule is None or line is None:
        return None
    if shutdown_line is not None and line.line_no >= shutdown_line:
        return None
    return Classified(rule=rule, line=line)
