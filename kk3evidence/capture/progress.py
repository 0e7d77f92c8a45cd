"""The one-line live progress on stderr during ``capture`` (``--quiet`` turns it off).

On a terminal the line is redrawn in place (``\\r``) while the command is quiet and erased
before the command's own output is passed through, so the two never mix on one line. Elsewhere
(a file, CI) a plain line is written when the stage changes and every few minutes.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable

__all__ = ["ProgressLine"]

_QUIET_BEFORE_DRAW = 1.0  # seconds of no output from the command before the line is drawn
_PLAIN_EVERY = 300.0  # seconds between plain progress lines when the stage does not change
_CLEAR = b"\r\x1b[2K"


class ProgressLine:
    def __init__(self, fd: int = 2, *, tty: bool | None = None) -> None:
        self._fd = fd
        self.tty = os.isatty(fd) if tty is None else tty
        self._shown = False
        self._last_output = 0.0
        self._lock = threading.Lock()
        self._plain_at = 0.0
        self._plain_stage: str | None = None

    def wrap(self, sink: Callable[[bytes], None]) -> Callable[[bytes], None]:
        """The pass-through sink, erasing the progress line first when it is shown."""
        if not self.tty:
            return sink

        def write(data: bytes) -> None:
            self._last_output = time.monotonic()
            if self._shown:
                with self._lock:
                    if self._shown:
                        os.write(self._fd, _CLEAR)
                        self._shown = False
            sink(data)

        return write

    def show(self, text: str) -> None:
        now = time.monotonic()
        if not self.tty:
            stage = text.split(" ", 1)[0]
            if stage != self._plain_stage or now - self._plain_at >= _PLAIN_EVERY:
                self._plain_stage, self._plain_at = stage, now
                self._write(f"kk3evidence: progress: {text}\n".encode())
            return
        if now - self._last_output < _QUIET_BEFORE_DRAW:
            return
        cols = shutil.get_terminal_size((100, 20)).columns
        line = "kk3evidence: " + text
        with self._lock:
            self._write(_CLEAR + line[: max(20, cols - 1)].encode("utf-8", "replace"))
            self._shown = True

    def clear(self) -> None:
        with self._lock:
            if self._shown:
                self._write(_CLEAR)
                self._shown = False

    def _write(self, data: bytes) -> None:
        try:
            os.write(self._fd, data)
        except OSError:
            self.tty = False
