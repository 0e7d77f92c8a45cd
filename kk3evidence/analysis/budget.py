"""How much of a log an analysis reads: a byte budget, and the coverage it reports.

Two shapes (issue 16):

* **a stream cap** (``analyze --max-bytes``): read at most N bytes, analyse them, stop. An
  endless input (``analyze -`` fed forever, a FIFO that never closes) ends.
* **head + tail** (what ``report``, ``diff`` and ``compare`` analyse by default): the first
  ``head_bytes`` (start-up failures live there) and the last ``tail_bytes`` (serving-time
  crashes and the end of the run) are analysed; the middle is read only to count its lines
  (C speed), so line numbers in the tail stay the file's.

Either way the result carries a :class:`Coverage` saying exactly what was analysed, so no
answer pretends to cover bytes it never looked at.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from kk3evidence.model import JSONObject

__all__ = ["Budget", "Coverage", "Piece", "budgeted", "coverage", "describe"]

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Budget:
    """``head_bytes`` analysed from the start; ``tail_bytes`` from the end (``None``: stop
    reading after the head, for inputs that may never end)."""

    head_bytes: int
    tail_bytes: int | None = None
    #: how to analyse everything, for the coverage note (a CLI flag or option)
    lift: str = "--max-bytes 0"

    def __post_init__(self) -> None:
        if self.head_bytes < 0 or (self.tail_bytes is not None and self.tail_bytes < 0):
            raise ValueError("budget bytes must be >= 0")


@dataclass(frozen=True, slots=True)
class Coverage:
    """What part of the input an analysis covered (the ``coverage`` field of its JSON)."""

    complete: bool
    bytes_read: int
    bytes_analysed: int
    #: the input ended (False: reading stopped at the cap, the rest was never read)
    ended: bool
    #: 1-based line numbers not analysed (first, last), when a middle was skipped
    skipped_lines: tuple[int, int] | None = None
    limit_bytes: int | None = None
    lift: str = ""

    def to_json(self) -> JSONObject:
        return {
            "complete": self.complete,
            "bytes_read": self.bytes_read,
            "bytes_analysed": self.bytes_analysed,
            "input_ended": self.ended,
            "skipped_lines": list(self.skipped_lines) if self.skipped_lines else None,
            "limit_bytes": self.limit_bytes,
            "lift": self.lift,
        }


@dataclass(frozen=True, slots=True)
class Piece:
    """A step of a budgeted read: bytes to analyse, or ``skip`` lines not analysed."""

    kind: Literal["data", "skip"]
    data: bytes = b""
    lines: int = 0


def describe(doc: Mapping[str, object]) -> str:
    """One line for people from a ``coverage`` JSON object: what was analysed, and how to
    analyse everything."""
    analysed, read, limit = doc.get("bytes_analysed"), doc.get("bytes_read"), doc.get("limit_bytes")
    lift = doc.get("lift") or "a larger budget"
    if doc.get("complete"):
        return f"the whole log was analysed ({analysed} bytes)"
    if not doc.get("input_ended"):
        return (f"analysed the first {analysed} bytes only: reading stopped at the "
                f"{limit}-byte limit and the rest of the input was not read; "
                f"{lift} reads everything")
    lines = doc.get("skipped_lines")
    where = (f"lines {lines[0]}-{lines[1]}" if isinstance(lines, list) and len(lines) == 2
             else "the middle")
    return (f"analysed {analysed} of {read} bytes (the start and the end of the log; "
            f"{where} not analysed, budget {limit} bytes); {lift} analyses everything")


class _Tally:
    def __init__(self) -> None:
        self.read = 0
        self.analysed = 0
        self.ended = True
        self.skip_from = 0  # line number (1-based) of the first skipped line
        self.skipped = 0


def budgeted(blocks: Iterable[bytes], budget: Budget) -> tuple[Iterator[Piece], _Tally]:
    """The pieces to feed an analysis under ``budget``, and a tally filled in as they go."""
    tally = _Tally()
    return _pieces(iter(blocks), budget, tally), tally


def _pieces(blocks: Iterator[bytes], budget: Budget, tally: _Tally) -> Iterator[Piece]:
    lines = 0
    last = b"\n"  # the last byte fed (does the head end on a line end?)
    carry = b""  # what follows the head's cut in its block
    for block in blocks:
        room = budget.head_bytes - tally.read
        tally.read += len(block)
        if len(block) <= room:
            tally.analysed += len(block)
            lines += block.count(b"\n")
            last = block[-1:] or last
            yield Piece("data", block)
            continue
        if budget.tail_bytes is None:  # a stream cap: analyse up to the cap, read no more
            tally.analysed += room
            tally.ended = False
            if room:
                yield Piece("data", block[:room])
            return
        # Head + tail: the head ends at the last newline before the cut.
        cut = block.rfind(b"\n", 0, room) + 1
        if cut:
            tally.analysed += cut
            lines += block.count(b"\n", 0, cut)
            last = b"\n"
            yield Piece("data", block[:cut])
        carry = block[cut:]
        break
    else:
        return
    yield from _tail(blocks, carry, budget.tail_bytes or 0, (lines, last == b"\n"), tally)


def _tail(
    blocks: Iterator[bytes], carry: bytes, tail_bytes: int, head: tuple[int, bool],
    tally: _Tally,
) -> Iterator[Piece]:
    """Read the rest keeping only its last ``tail_bytes``; count the lines that fall out."""
    ring: collections.deque[bytes] = collections.deque([carry])
    held = len(carry)
    dropped_lines = dropped_bytes = 0
    dropped_nl = True  # the last dropped byte is a newline (or nothing was dropped)
    for block in blocks:
        tally.read += len(block)
        ring.append(block)
        held += len(block)
        while len(ring) > 1 and held - len(ring[0]) >= tail_bytes:
            old = ring.popleft()
            held -= len(old)
            dropped_lines += old.count(b"\n")
            dropped_bytes += len(old)
            dropped_nl = old.endswith(b"\n") if old else dropped_nl
    chunks = list(ring)  # references: the tail is fed chunk by chunk, never joined
    ends_nl = next((c.endswith(b"\n") for c in reversed(chunks) if c), dropped_nl)
    i, start = 0, max(0, held - tail_bytes)  # the tail starts in chunks[0] at `start`
    if start or dropped_bytes:
        # The tail starts on a line of its own: the skipped part ends with a newline.
        if not (chunks[0][start - 1 : start] == b"\n" if start else dropped_nl):
            while i < len(chunks):
                nl = chunks[i].find(b"\n", start)
                if nl >= 0:
                    start = nl + 1
                    break
                i, start = i + 1, 0
        for c in chunks[:i]:
            dropped_lines += c.count(b"\n")
            dropped_bytes += len(c)
        if i < len(chunks):
            dropped_lines += chunks[i].count(b"\n", 0, start)
            dropped_bytes += start
    rest = [chunks[i][start:], *chunks[i + 1 :]] if i < len(chunks) else []
    if dropped_bytes and not any(rest) and not ends_nl:
        dropped_lines += 1  # the log's last line (no newline) fell out whole
    head_lines, head_ends_nl = head
    if dropped_bytes:
        skipped = dropped_lines
        if not head_ends_nl:
            # The head's last line was cut: end it here (it keeps its number; its real newline
            # is the first skipped one).
            yield Piece("data", b"\n")
            head_lines += 1
            skipped -= 1
        tally.skip_from = head_lines + 1
        tally.skipped = skipped
        yield Piece("skip", lines=skipped)  # even 0: the rest of the head's last line
    for c in rest:
        if c:
            tally.analysed += len(c)
            yield Piece("data", c)


def coverage(tally: _Tally, budget: Budget) -> Coverage:
    """The :class:`Coverage` of a finished budgeted read."""
    skipped = (
        (tally.skip_from, tally.skip_from + tally.skipped - 1) if tally.skipped else None
    )
    limit = budget.head_bytes + (budget.tail_bytes or 0)
    return Coverage(
        complete=tally.ended and tally.analysed >= tally.read,
        bytes_read=tally.read,
        bytes_analysed=tally.analysed,
        ended=tally.ended,
        skipped_lines=skipped,
        limit_bytes=limit,
        lift=budget.lift,
    )
