"""How many real vLLM servers the tests run at once, across pytest-xdist workers.

``vllm_slot(weight)`` holds ``weight`` of ``KK3_VLLM_SLOTS`` slots (default 2) while a real
vLLM server runs: one ``fcntl`` lock file per slot (``KK3_VLLM_LOCK`` + ``.0``, ``.1``, …). A
single server takes one slot; a two-node group (two servers that must start together) takes
them all. Two single servers at once fit this 2-core machine: a CPU start is mostly one
process importing Python at a time (measured: the suite's real-vLLM tests pass with two at
once, and each start takes about as long as alone). ``KK3_VLLM_SLOTS=1`` runs one at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

SLOTS = max(1, int(os.environ.get("KK3_VLLM_SLOTS", "2")))
BASE = os.environ.get("KK3_VLLM_LOCK", "/tmp/kk3-vllm.lock")


def _paths() -> list[Path]:
    # Slot 0 is the single lock file of earlier versions: a checkout still using it and this
    # one still exclude each other.
    return [Path(BASE if i == 0 else f"{BASE}.{i}") for i in range(SLOTS)]


def _try(path: Path) -> IO[str] | None:
    fh = path.open("a")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        return None
    except BaseException:
        fh.close()
        raise
    return fh


@contextlib.contextmanager
def vllm_slot(weight: int = 1) -> Iterator[None]:
    """Hold one slot (``weight`` 1: a single server) or all of them (``weight`` >= the number
    of slots: a group, or a test running two servers). A single taker never holds a slot while
    waiting for another, so takers of both kinds cannot deadlock."""
    if not (weight == 1 or weight >= SLOTS):
        raise ValueError(f"vllm_slot: weight 1 or {SLOTS} (all), not {weight}")
    held: list[IO[str]] = []
    try:
        if weight >= SLOTS:
            for path in _paths():  # always in the same order: no deadlock between two takers
                fh = path.open("a")
                held.append(fh)
                fcntl.flock(fh, fcntl.LOCK_EX)
        else:
            while not held:
                for path in _paths():
                    if (fh := _try(path)) is not None:
                        held.append(fh)
                        break
                else:
                    time.sleep(0.5)
        yield
    finally:
        for fh in held:
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()
