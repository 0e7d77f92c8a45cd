"""The capture's running totals, kept where a full disk or a SIGKILL cannot erase them.

A capture writes ``.capture-ledger`` into its staging folder at the start: 64 KiB, allocated
then. While the capture runs, the log writer overwrites it in place with what it has received,
what it has written and what it has lost (``pwrite`` into blocks the file already owns needs no
free space, so this works on a full disk). ``seal`` reads it: a capture that ended normally
says so (``final``); one that was killed leaves the bytes it had received but not yet written,
and seal records them as a loss instead of losing them silently. The name starts with a dot,
so it is never a bundle member.

Beside it, ``.capture-counters`` holds two numbers in a shared memory mapping of the file
(:class:`Counters`): the bytes capture received from CMD, counted *before* they are passed
through to the terminal, and how much redaction shrank what was written to the log. A store into
a ``MAP_SHARED`` mapping is in the page cache at once: it survives a SIGKILL of the process a
moment later, with no system call in between. So ``seal`` knows exactly how much capture had
received when it died, and counts ``received - log size - shrink`` as lost.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import cast

from kk3evidence.model import JSONObject

__all__ = ["COUNTERS_NAME", "LEDGER_NAME", "Counters", "Ledger", "read_counters", "read_ledger"]

LEDGER_NAME = ".capture-ledger"
LEDGER_BYTES = 64 * 1024
COUNTERS_NAME = ".capture-counters"
#: magic, received bytes, redaction shrink (bytes in minus bytes written; signed)
_COUNTERS = struct.Struct("<8sQq")
_RECEIVED = struct.Struct("<Q")
_SHRINK = struct.Struct("<q")
_MAGIC = b"kk3cnt01"


class Counters:
    """Two running totals in a shared mapping of a small file (best effort: unusable when the
    file cannot be made; then every method does nothing)."""

    def __init__(self, staging_dir: str | os.PathLike[str]) -> None:
        self.path = Path(staging_dir) / COUNTERS_NAME
        self._map: mmap.mmap | None = None
        self._received = 0
        self._shrink = 0
        with contextlib.suppress(OSError, ValueError):
            flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
            fd = os.open(self.path, flags, 0o600)
            try:
                # pwrite, not ftruncate: the block is allocated now, so a full disk later
                # cannot fail a store into the mapping with SIGBUS.
                os.pwrite(fd, _COUNTERS.pack(_MAGIC, 0, 0), 0)
                self._map = mmap.mmap(fd, _COUNTERS.size, mmap.MAP_SHARED, mmap.PROT_WRITE)
            finally:
                os.close(fd)

    @property
    def usable(self) -> bool:
        return self._map is not None

    def add_received(self, nbytes: int) -> None:
        self._received += nbytes
        if self._map is not None:  # each field has one writer thread: no lock
            _RECEIVED.pack_into(self._map, 8, self._received)

    def add_shrink(self, nbytes: int) -> None:
        if nbytes == 0:
            return
        self._shrink += nbytes
        if self._map is not None:
            _SHRINK.pack_into(self._map, 16, self._shrink)

    def close(self) -> None:
        if self._map is not None:
            with contextlib.suppress(OSError, ValueError):
                self._map.close()
            self._map = None


def read_counters(staging_dir: str | os.PathLike[str]) -> tuple[int, int] | None:
    """``(received, shrink)`` from a capture's counters file (``None``: none, or unreadable)."""
    path = Path(staging_dir) / COUNTERS_NAME
    if path.is_symlink() or not path.is_file():
        return None
    try:
        with open(path, "rb") as fp:
            raw = fp.read(_COUNTERS.size)
        magic, received, shrink = _COUNTERS.unpack(raw)
    except (OSError, struct.error):
        return None
    return (received, shrink) if magic == _MAGIC else None


class Ledger:
    """Overwrites one preallocated file with a small JSON document (best effort)."""

    def __init__(self, staging_dir: str | os.PathLike[str]) -> None:
        self.path = Path(staging_dir) / LEDGER_NAME
        self._fd: int | None = None
        self._last = 0
        self.counters = Counters(staging_dir)
        with contextlib.suppress(OSError):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
            try:
                os.pwrite(fd, b" " * LEDGER_BYTES, 0)  # the blocks are ours from now on
            except OSError:
                os.close(fd)
                raise
            self._fd = fd

    @property
    def usable(self) -> bool:
        return self._fd is not None

    def update(self, doc: Mapping[str, object]) -> None:
        if self._fd is None:
            return
        data = json.dumps(doc, separators=(",", ":")).encode()
        if len(data) >= LEDGER_BYTES:
            short = dict(doc)
            short["losses"] = list(cast(Iterable[object], doc.get("losses") or []))[:20]
            short["losses_truncated"] = True
            data = json.dumps(short, separators=(",", ":")).encode()[: LEDGER_BYTES - 1]
        # Pad over what the previous, longer version left behind.
        padded = data + b" " * max(0, self._last - len(data))
        with contextlib.suppress(OSError):
            os.pwrite(self._fd, padded, 0)
        self._last = len(data)

    def close(self) -> None:
        self.counters.close()
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def read_ledger(staging_dir: str | os.PathLike[str]) -> JSONObject | None:
    """The last document a capture left in ``staging_dir`` (``None``: none, or unreadable)."""
    path = Path(staging_dir) / LEDGER_NAME
    if path.is_symlink() or not path.is_file():
        return None
    try:
        with open(path, "rb") as fp:
            raw = fp.read(LEDGER_BYTES)
        doc = json.loads(raw.strip() or b"null")
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
