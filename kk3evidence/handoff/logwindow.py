"""Lines of a large log by number, at C speed (issue 16).

A report shows a few lines around the first failure and the last lines of the log; a diff or
compare needs the same. Reading a multi-GB log line by line in Python to find them took most
of a minute; :class:`LineCursor` counts and skips newlines in 4 MiB chunks (``bytes.count``),
keeps only the lines asked for, each cut to a display limit, and the last lines through a
bounded ring. Memory is a few chunks, whatever the line lengths.
"""

from __future__ import annotations

import collections
from typing import BinaryIO

__all__ = ["LineCursor"]

CHUNK = 4 * 1024 * 1024

#: (line number, its first bytes, its full length)
_Line = tuple[int, bytes, int]


class LineCursor:
    """Forward-only access to the lines of ``fp`` (1-based numbers, only ``\\n`` ends a line).

    :meth:`skip_to` moves to a line without keeping anything; :meth:`read` returns the next
    line cut to ``keep`` bytes with its full length; :meth:`tail` reads to the end and returns
    the last lines.
    """

    def __init__(self, fp: BinaryIO, chunk: int = CHUNK) -> None:
        self._fp = fp
        self._chunk = chunk
        self._buf = b""
        self._pos = 0
        self.next_line = 1  # the number of the line :meth:`read` returns next
        self._eof = False

    def _fill(self) -> bool:
        if self._eof:
            return False
        data = self._fp.read(self._chunk)
        if not data:
            self._eof = True
            return False
        self._buf = self._buf[self._pos :] + data
        self._pos = 0
        return True

    def skip_to(self, line: int) -> None:
        """Consume lines until the next :meth:`read` returns ``line`` (or the end)."""
        while self.next_line < line:
            need = line - self.next_line
            buf, pos = self._buf, self._pos
            have = buf.count(b"\n", pos)
            if have >= need:
                for _ in range(need):  # at most one chunk's lines: the rest was counted
                    pos = buf.index(b"\n", pos) + 1
                self._pos = pos
                self.next_line = line
                return
            self.next_line += have
            # Inside a line being skipped, its bytes are not needed: drop them.
            self._buf, self._pos = b"", 0
            if not self._fill():
                return

    def read(self, keep: int) -> tuple[bytes, int] | None:
        """The next line's first ``keep`` bytes (with its newline when whole) and its full
        length; ``None`` at the end."""
        head = b""
        length = 0
        while True:
            nl = self._buf.find(b"\n", self._pos)
            end = len(self._buf) if nl < 0 else nl + 1
            piece = self._buf[self._pos : end]
            length += len(piece)
            if len(head) < keep:
                head += piece[: keep - len(head)]
            self._pos = end
            if nl >= 0:
                break
            self._buf, self._pos = b"", 0
            if not self._fill():
                if not length:
                    return None
                break
        self.next_line += 1
        return head, length

    def tail(
        self, count: int, keep: int, window: tuple[int, int] = (0, -1)
    ) -> tuple[list[_Line], list[_Line]]:
        """Read to the end; the last ``count`` lines as (number, first ``keep`` bytes, full
        length), and the lines numbered ``window[0]..window[1]`` passed on the way (found in
        the same pass, so a window near the end is never lost): ``(window, last)``. A line
        longer than a chunk is kept by its first ``keep`` bytes."""
        lo, hi = window
        seen: list[_Line] = []
        ring: collections.deque[_Line] = collections.deque(maxlen=count)
        while True:
            buf, pos = self._buf, self._pos
            done = buf.count(b"\n", pos)
            first, skip = self.next_line, done - count
            if skip > 0 and not (first <= hi and lo < first + skip):
                # Jump to the last `count` complete lines of this buffer at C speed.
                idx = len(buf)
                for _ in range(count + 1):
                    idx = buf.rindex(b"\n", pos, idx)
                self.next_line += skip
                self._pos = idx + 1
                self._skipped_partial = 0
                ring.clear()
            while (nl := self._buf.find(b"\n", self._pos)) >= 0:
                raw = self._buf[self._pos : nl + 1]
                line = (self.next_line, raw[:keep], len(raw) + self._skipped_partial)
                ring.append(line)
                if lo <= self.next_line <= hi:
                    seen.append(line)
                self._skipped_partial = 0
                self._pos = nl + 1
                self.next_line += 1
            if len(self._buf) - self._pos > keep:
                self._partial_head(keep)  # a long unfinished line: its head only
            if not self._fill():
                break
        rest = self._buf[self._pos :]
        if rest:
            line = (self.next_line, rest[:keep], len(rest) + self._skipped_partial)
            ring.append(line)
            if lo <= self.next_line <= hi:
                seen.append(line)
        return seen, list(ring)

    _skipped_partial = 0

    def _partial_head(self, keep: int) -> None:
        """Within a line longer than ``keep``: drop its middle, remember how much."""
        start = self._pos
        self._skipped_partial += len(self._buf) - start - keep
        self._buf = self._buf[start : start + keep]
        self._pos = 0
