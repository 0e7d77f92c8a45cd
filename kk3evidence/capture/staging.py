"""One staging folder per capture, claimed atomically, and a bundle name that is never taken.

Captures started in the same second without ``-o`` would share the default name
(``kk3-YYYYmmdd-HHMMSS.tar``, one-second resolution) and so one staging folder. Here each
capture claims its staging folder with an exclusive ``mkdir`` (the kernel picks one winner);
a capture without ``-o`` that loses moves on to ``kk3-YYYYmmdd-HHMMSS-2.tar``, ``-3``, ….
An explicit ``-o`` naming an existing file is refused (SPEC §3: a bundle is never
overwritten); the final rename refuses too if the name was taken meanwhile (archive.py).
"""

from __future__ import annotations

import errno
from datetime import UTC, datetime
from pathlib import Path

from kk3evidence.errors import CaptureError, UsageError

__all__ = ["default_output", "reserve", "staging_for"]

#: how many same-second default names are tried before giving up
MAX_SAME_SECOND = 10_000


def default_output(now: datetime | None = None, n: int = 1) -> Path:
    """``kk3-YYYYmmdd-HHMMSS.tar`` (UTC), ``-N`` added for the N-th capture of that second."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    return Path(f"kk3-{stamp}.tar" if n <= 1 else f"kk3-{stamp}-{n}.tar")


def staging_for(output: Path) -> Path:
    return output.with_name(output.name + ".staging")


def reserve(output: Path | None, staging: Path | None, created: datetime) -> tuple[Path, Path]:
    """The bundle path and the staging folder of a new capture, the folder created by us.

    ``output``/``staging`` are what the user gave (``None``: pick). Raises UsageError when an
    explicit bundle exists or an explicit staging folder already holds a capture.
    """
    if output is not None:
        if output.exists() or output.is_symlink():
            raise UsageError(
                f"capture: {output} already exists; a bundle is never overwritten: "
                "pass another -o, or move that file away"
            )
        return output, _claim(staging or staging_for(output), given=staging is not None)
    for n in range(1, MAX_SAME_SECOND + 1):
        out = default_output(created, n)
        if out.exists() or out.is_symlink():
            continue
        if staging is not None:
            return out, _claim(staging, given=True)
        try:
            return out, _claim(staging_for(out), given=False, auto=True)
        except _Taken:
            continue  # another capture of the same second holds this name
    raise CaptureError(
        f"capture: {MAX_SAME_SECOND} bundles named {default_output(created)} and its "
        "numbered variants already exist here; pass -o"
    )


class _Taken(Exception):
    pass


def _claim(folder: Path, *, given: bool, auto: bool = False) -> Path:
    """Create ``folder`` exclusively. A folder the user named (``given``) may already exist
    if empty; one we named must be new: an empty one may be another capture's that has just
    started. ``auto``: the name is ours to change, so a taken one raises ``_Taken``."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir()
        return folder
    except FileExistsError:
        if auto:
            raise _Taken() from None
        if given and folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
            return folder
        hint = "pass --staging" if given else "pass another -o or --staging"
        raise UsageError(
            f"staging folder {folder} already exists (another capture's, or one that died); "
            f"seal it with 'kk3evidence seal {folder}' or remove it, or {hint}"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise UsageError(f"capture: the path {str(folder)[:120]}... is too long") from None
        raise CaptureError(
            f"cannot create the staging folder {folder}: {exc.strerror}; "
            "check the folder exists and is writable, or pass --staging"
        ) from None
