"""A serving stall from vLLM's own stats lines: requests running, no token for a while.

A server that answers ``/health`` but whose engine stopped stepping (a stuck collective, a
deadlocked scheduler, a request waiting forever on a KV transfer) logs no error at all. vLLM's
periodic stats line still tells: ``Avg prompt throughput: 0.0 tokens/s, Avg generation
throughput: 0.0 tokens/s, Running: 1 reqs`` — a request is scheduled and not one token was
processed in the whole interval (10 s by default). One such line can be a slow step; two in a
row of the same engine cannot: :data:`MIN_LINES` consecutive ones are a stall (SPEC §2: "no
progress — a stall with no stated cause"). vLLM V1 logs a zero line at INFO only when the
interval before had progress (``engine_is_idle`` in ``v1/metrics/loggers.py``: later ones go
to DEBUG), so at the default level a stuck engine prints one such line and falls silent: a
run's last zero line followed by :data:`SILENT_S` seconds of log (its timestamps, or a
bundle's receive times) with no stats line of that engine is a stall too.

:class:`ServingStallWatch` runs beside the block scan and keeps the first such run;
:func:`~.hang.apply_hang` reports it only when the log states no failure. No extra pass over
the log: :data:`ZERO_MARK` is one of the engine's prefilter anchors (noise-only, so it never
makes the engine look at a line), and blocks without :data:`STATS_ANCHOR` are skipped.

V0 (``llm_engine.py``/``metrics.py``: ``… Running: N reqs, Swapped: …, Pending: …``) and V1
(``loggers.py``: ``Engine 000: … Running: N reqs, Waiting: …``, one line per engine of a
data-parallel server) print the same three fields.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import replace
from datetime import datetime

from kk3evidence.analysis.envelope import parse_line
from kk3evidence.analysis.progress import whole_lines
from kk3evidence.model import ServingStall

__all__ = [
    "MIN_LINES",
    "SILENT_S",
    "STATS_ANCHOR",
    "ZERO_MARK",
    "ServingStallWatch",
    "stamp_seconds",
]

#: consecutive zero-progress stats lines of one engine (with requests running) that make a stall
MIN_LINES = 2
#: seconds of log after a run's last zero line, without a stats line of its engine, that make
#: a one-line run a stall (two and a half of vLLM's default 10 s stats intervals)
SILENT_S = 25.0
_STAMP_RE = re.compile(r"^(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})")
#: text every stats line holds (the serving milestone's anchor: the engine skips blocks without)
STATS_ANCHOR = "Avg prompt throughput"
_MARK = b"Avg generation throughput: "
#: a stats line without a generated token (vLLM prints one decimal); a prefilter anchor
ZERO_MARK = "Avg generation throughput: 0.0 tokens/s"
_STATS_RE = re.compile(
    rb"(?:Engine (\d+): )?Avg prompt throughput: (\d+(?:\.\d+)?) tokens/s, "
    rb"Avg generation throughput: (\d+(?:\.\d+)?) tokens/s, Running: (\d+) reqs"
)
_MAX_TEXT = 2000  # characters of a stats line kept


class ServingStallWatch:
    """Fed the engine's blocks (whole lines); keeps the first stall (bounded memory)."""

    def __init__(self) -> None:
        # engine id -> (first line, last line, count, running, first and last raw text) of its
        # current run (its latest stats line said requests were running at zero)
        self._runs: dict[bytes | None, tuple[int, int, int, int, bytes, bytes]] = {}
        self._found: bytes | None = None  # the engine whose run became the stall
        self.stall: ServingStall | None = None
        self._pending = b""  # (feed) an incomplete last line
        self.lines = 0  # (feed) complete lines fed
        #: the latest ``(line, MM-DD HH:MM:SS)`` found among a block's last lines while a run
        #: was open (the silence after a one-line run is measured to it)
        self.latest_stamp: tuple[int, str] | None = None

    def feed(self, data: bytes) -> None:
        """Consume log bytes in any chunking (capture's watchdog, after ready); the zero
        markers are found here (the analysis engine hands them to :meth:`scan` instead)."""
        block, self._pending = whole_lines(self._pending, data)
        if not block:
            return
        marker = ZERO_MARK.encode()
        zeros: list[int] = []
        at = block.find(marker)
        while at >= 0:
            zeros.append(at + len(marker))
            at = block.find(marker, at + len(marker))
        self.scan(block, 0, len(block), self.lines, zeros)
        self.lines += block.count(b"\n")

    def gap(self, lines: int = 0) -> None:
        """Part of the log was not looked at (a flood skipped): no run continues across it."""
        self._runs.clear()
        self._pending = b""
        self.latest_stamp = None
        self.lines += lines

    def scan(self, block: bytes, lo: int, n: int, base: int, zeros: list[int]) -> None:
        """Look at the stats lines of ``block[lo:n]``, whose first line is line ``base + 1``;
        ``zeros``: the end offsets of :data:`ZERO_MARK` in it, ascending (the engine's
        prefilter reports them with its other hits).

        Only zero-generation lines are parsed (a healthy server logs thousands of stats lines);
        the stats lines between two of them are looked at only while a run is open, to end
        the run of their engine (a line between is never itself zero: it would be a hit)."""
        if self.stall is not None and self._found not in self._runs:
            return  # the stall's run has ended: nothing later changes the answer
        if not zeros and not self._runs:
            return
        self._scan(block, lo, n, base, zeros)
        if self._runs and self.stall is None:
            found = _last_stamp(block, lo, n)
            if found is not None:
                last_line = base + block.count(b"\n", lo, n) + (n > lo and block[n - 1] != 10)
                self.latest_stamp = (last_line - found[0], found[1])

    def _scan(self, block: bytes, lo: int, n: int, base: int, zeros: list[int]) -> None:
        find = block.find
        prev, counted, line_no = lo, lo, base
        done_to = lo - 1
        for at in (*zeros, -1):
            if 0 <= at <= done_to:
                continue  # a second marker in a line already looked at
            s = n if at < 0 else max(lo, block.rfind(b"\n", lo, at) + 1)
            if self._runs:
                self._between(block, prev, s, n)
            if at < 0:
                return
            e = find(b"\n", at, n)
            e = n if e < 0 else e
            done_to = e
            line_no += block.count(b"\n", counted, s) + 1
            counted = e + 1 if e < n else e
            m = _STATS_RE.search(block, s, e)
            if m is not None:
                self._stats_line(m, line_no, block[s:e])
                if self.stall is not None and self._found not in self._runs:
                    return
            prev = e

    def _between(self, block: bytes, lo: int, hi: int, n: int) -> None:
        """Stats lines in ``block[lo:hi]`` (none of them zero-generation): each ends the run of
        its engine."""
        g = block.find(_MARK, lo, hi)
        while g >= 0 and self._runs:
            s = max(lo, block.rfind(b"\n", lo, g) + 1)
            e = block.find(b"\n", g, n)
            e = n if e < 0 else e
            m = _STATS_RE.search(block, s, e)
            if m is not None:
                self._runs.pop(m.group(1), None)
            g = block.find(_MARK, e, hi)

    def _stats_line(self, m: re.Match[bytes], line_no: int, raw: bytes) -> None:
        if self.stall is not None and self._found not in self._runs:
            return  # the first stall's run has ended: a later run changes nothing
        engine = m.group(1)
        running = int(m.group(4))
        still = running > 0 and float(m.group(2)) == 0.0 and float(m.group(3)) == 0.0
        run = self._runs.get(engine)
        if not still:
            self._runs.pop(engine, None)
            return
        kept = raw[:_MAX_TEXT]
        if run is None:
            run = (line_no, line_no, 1, running, kept, kept)
        else:
            run = (run[0], line_no, run[2] + 1, run[3], run[4], kept)
        self._runs[engine] = run
        if run[2] >= MIN_LINES and (self.stall is None or self._found == engine):
            self._found = engine
            self.stall = _stall_of(engine, run)

    @property
    def has_open_run(self) -> bool:
        """No stall yet, and some engine's latest stats line is a zero line (see open_run)."""
        return self.stall is None and bool(self._runs)

    def open_run(self) -> ServingStall | None:
        """The earliest run still open (its engine's latest stats line is a zero line with
        requests running), unconfirmed, when no stall was found: the start of a silence."""
        if not self.has_open_run:
            return None
        engine, run = min(self._runs.items(), key=lambda kv: kv[1][0])
        return replace(_stall_of(engine, run), confirmed=False)

    def result(self, lines_total: int) -> ServingStall | None:
        """The stall at the end of a log of ``lines_total`` lines: the one found, else the open
        run — confirmed when a timestamp among the log's last :data:`_STAMP_LOOKBACK` lines is
        :data:`SILENT_S` or more after its last line's (whatever the blocks: only a stamp that
        near the end counts), else unconfirmed (a bundle's times may confirm it)."""
        if self.stall is not None:
            return self.stall
        run = self.open_run()
        if run is None:
            return None
        last = stamp_seconds(parse_line(run.last_line, run.last_text).timestamp)
        latest = self.latest_stamp
        near = latest is not None and lines_total - latest[0] < _STAMP_LOOKBACK
        now = stamp_seconds(latest[1]) if latest is not None and near else None
        if last is None or now is None:
            return run
        gap = now - last
        if gap < -_YEAR_S / 2:
            gap += _YEAR_S  # the log went from December into January (not a stamp out of order)
        if gap >= SILENT_S:
            return replace(run, silent_s=gap, confirmed=True)
        return run


def _stall_of(
    engine: bytes | None, run: tuple[int, int, int, int, bytes, bytes]
) -> ServingStall:
    return ServingStall(
        first_line=run[0],
        last_line=run[1],
        lines=run[2],
        running=run[3],
        engine=None if engine is None else engine.decode("ascii"),
        text=run[4],
        last_text=run[5],
    )


_STAMP_LOOKBACK = 64  # lines looked at, from a block's end, for its latest timestamp
_YEAR_S = 366 * 86400  # stamps are placed in 2000, a leap year


def _last_stamp(block: bytes, lo: int, n: int) -> tuple[int, str] | None:
    """``(lines before the range's last line, timestamp)`` of the last of ``block[lo:n]``'s
    final :data:`_STAMP_LOOKBACK` lines that carries a vLLM timestamp."""
    end = n
    if end > lo and block[end - 1] == 10:
        end -= 1  # the range's final newline ends its last line
    for back in range(_STAMP_LOOKBACK):
        if end < lo or (end == lo and back):
            return None
        s = max(lo, block.rfind(b"\n", lo, end) + 1)
        head = block[s : min(end, s + 160)]
        if b":" in head:
            stamp = parse_line(0, head).timestamp
            if stamp and _STAMP_RE.match(stamp):
                return back, stamp
        end = s - 1
    return None


def stamp_seconds(stamp: str | None) -> float | None:
    """A vLLM ``MM-DD HH:MM:SS`` timestamp as seconds (any fixed year), or ``None``."""
    m = _STAMP_RE.match(stamp or "")
    if m is None:
        return None
    mo, d, hh, mm, ss = (int(x) for x in m.groups())
    try:
        datetime(2000, mo, d, hh, mm, ss)  # a real date (2000: Feb 29 exists)
    except ValueError:
        return None
    return float(calendar.timegm((2000, mo, d, hh, mm, ss, 0, 0, 0)))  # no local time zone
