"""The capture's running totals, kept where a full disk or a SIGKILL cannot erase them.

A capture writes ``.capture-ledger`` into its staging folder at the start: 64 KiB, allocated
then. While the capture runs, the log writer overwrites it in place with what it has received,
what it has written and what it has lost (``pwrite`` into blocks the file already owns needs no
free space, so this works on a full disk). ``seal`` reads it: a capture that ended normally
says so (``final``); one that was killed leaves the bytes it had received but not yet written,
and seal records them as a loss instead of losing them silently. The name starts with a dot,
so it is never a bundle member.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import cast

from kk3evidence.model import JSONObject

__all__ = ["LEDGER_NAME", "Ledger", "read_ledger"]

LEDGER_NAME = ".capture-ledger"
LEDGER_BYTES = 64 * 1024


class Ledger:
    """Overwrites one preallocated file with a small JSON document (best effort)."""

    def __init__(self, staging_dir: str | os.PathLike[str]) -> None:
        self.path = Path(staging_dir) / LEDGER_NAME
        self._fd: int | None = None
        self._last = 0
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
