"""What a bundle adds to the hang verdict: ``launch.json``, ``stalls/*.json``, ``lines.tsv``.

Read through the bundle reader (verified members, streamed); anything missing or unreadable
simply leaves that input out: the verdict then rests on the log alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kk3evidence.analysis.hang import StallInputs
from kk3evidence.bundle.archive import BUNDLE_SUFFIXES
from kk3evidence.errors import Kk3Error

__all__ = ["bundle_stall_inputs"]

_LINES = "logs/lines.tsv"
_MAX_SNAPSHOTS = 8


def bundle_stall_inputs(source: object) -> StallInputs | None:
    """The stall inputs of a bundle path (``None`` for anything else or an unreadable one)."""
    if not isinstance(source, str | os.PathLike):
        return None
    path = Path(os.fspath(source))
    if not str(path).endswith(BUNDLE_SUFFIXES) or not path.is_file():
        return None
    try:
        from kk3evidence.bundle.archive import open_bundle

        with open_bundle(path) as b:
            names = b.names()
            snaps: list[dict[str, Any]] = []
            for n in sorted(x for x in names if x.startswith("stalls/") and x.endswith(".json")):
                doc = b.json(n)
                if isinstance(doc, dict):
                    snaps.append({**doc, "member": n})
            launch = b.launch
            has_lines = _LINES in names
    except (Kk3Error, OSError, ValueError):
        return None
    reader = (lambda: _stream(path)) if has_lines else None
    return StallInputs(launch=launch, snapshots=tuple(snaps[-_MAX_SNAPSHOTS:]), lines_tsv=reader)


def _stream(path: Path) -> Iterator[bytes]:
    from kk3evidence.bundle.archive import open_bundle

    try:
        with open_bundle(path) as b, b.open_member(_LINES) as fp:
            while chunk := fp.read(1 << 20):
                yield chunk
    except (Kk3Error, OSError, ValueError):
        return
