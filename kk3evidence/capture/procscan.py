"""Which CUDA/NCCL/torch libraries the served program's process tree really loaded.

Reads ``/proc/PID/maps`` for the child and every descendant (and every process left in its
process group), keeps the mapped shared objects whose names match :data:`LIBRARY_NAMES`, and
derives a version from the file name (``libnccl.so.2.21.5``, ``libcuda.so.580.65.06``) or, for
pip-installed NVIDIA/torch wheels whose files are only ``libnccl.so.2``, from the wheel's
``*.dist-info`` folder beside it. A :class:`LibraryScanner` repeats this every few seconds in a
thread, so libraries loaded late (NCCL at ``init_device``) and by short-lived workers are seen.

``proc_root`` and ``read_maps`` are injectable so tests can use a fake ``/proc`` tree.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

#: library base names looked for (prefix match on the file name, before ``.so``)
LIBRARY_NAMES: tuple[str, ...] = (
    "libcuda",
    "libcudart",
    "libnccl",
    "libcublas",
    "libcublasLt",
    "libcudnn",
    "libnvrtc",
    "libnvJitLink",
    "libnvidia-ml",
    "libtorch_cuda",
    "libc10_cuda",
    "libtorch_cpu",
)

_SO_RE = re.compile(r"^(?P<base>lib[\w+\-]*?)(?:-[0-9a-f]{8})?\.so(?:\.(?P<ver>[0-9][0-9.]*))?$")


@dataclass(frozen=True, slots=True)
class LoadedLibrary:
    name: str
    path: str
    version: str | None
    pids: tuple[int, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "path": self.path,
            "version": self.version,
            "pids": list(self.pids),
        }


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def process_tree(root_pid: int, proc_root: str = "/proc") -> list[int]:
    """``root_pid``, its descendants, and every process in the group it leads."""
    parents: dict[int, int] = {}
    groups: dict[int, int] = {}
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return [root_pid]
    for entry in entries:
        if not entry.isdigit():
            continue
        stat = _read_text(f"{proc_root}/{entry}/stat")
        if not stat:
            continue
        # "pid (comm) state ppid pgrp ..."; comm may hold spaces and parentheses.
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) < 3:
            continue
        pid = int(entry)
        parents[pid] = int(rest[1])
        groups[pid] = int(rest[2])
    # The group counts only when the root leads it (capture starts CMD in a group of its own);
    # otherwise it is the caller's group and holds unrelated processes.
    found = {root_pid} | {p for p, g in groups.items() if g == root_pid}
    frontier = list(found)
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    while frontier:
        pid = frontier.pop()
        for child in children.get(pid, ()):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return sorted(p for p in found if p in parents or p == root_pid)


def group_members(pgid: int, proc_root: str = "/proc") -> list[int] | None:
    """Live (not zombie) processes of process group ``pgid``; ``None`` without ``/proc``."""
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return None
    out: list[int] = []
    for entry in entries:
        if not entry.isdigit():
            continue
        stat = _read_text(f"{proc_root}/{entry}/stat")
        if not stat:
            continue
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) >= 3 and rest[0] not in ("Z", "X") and int(rest[2]) == pgid:
            out.append(int(entry))
    return sorted(out)


def mapped_objects(maps_text: str) -> set[str]:
    """Paths of the shared objects in one ``/proc/PID/maps`` text."""
    out: set[str] = set()
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/") and ".so" in parts[5]:
            path = parts[5].strip()
            if path.endswith(" (deleted)"):
                path = path[: -len(" (deleted)")]
            out.add(path)
    return out


def classify_library(
    path: str, names: Iterable[str] = LIBRARY_NAMES
) -> tuple[str, str | None] | None:
    """``(name, version-from-file-name)`` when ``path`` is one of the libraries looked for."""
    m = _SO_RE.match(os.path.basename(path))
    if m is None:
        return None
    base = m.group("base")
    if base not in set(names):
        return None
    return base, m.group("ver")


_WHEEL_CACHE: dict[str, str | None] = {}
# library -> the nvidia-* wheel that ships it (without the "nvidia_" prefix)
_NVIDIA_WHEELS = {
    "libcudart": "cuda_runtime",
    "libnvrtc": "cuda_nvrtc",
    "libcublas": "cublas",
    "libcublasLt": "cublas",
    "libnvJitLink": "nvjitlink",
    "libcudnn": "cudnn",
    "libnccl": "nccl",
}


def wheel_version(path: str) -> str | None:
    """Version of the pip wheel that installed ``path`` (``site-packages/nvidia/nccl/lib/…``)."""
    if path in _WHEEL_CACHE:
        return _WHEEL_CACHE[path]
    version: str | None = None
    p = Path(path)
    parts = p.parts
    for i in range(len(parts) - 1, 0, -1):
        if parts[i] in ("site-packages", "dist-packages") and i + 1 < len(parts):
            site = Path(*parts[: i + 1])
            top = parts[i + 1]
            patterns = [f"{top}-*.dist-info"]
            if top == "nvidia" and i + 2 < len(parts):
                sub = parts[i + 2]
                patterns = [f"nvidia_{sub}*.dist-info", f"nvidia-{sub}*.dist-info"]
                # CUDA 13 wheels share nvidia/cu13/lib/: find the wheel by the library's name.
                hit = classify_library(path)
                wheel = _NVIDIA_WHEELS.get(hit[0]) if hit else None
                if wheel:
                    patterns[:0] = [
                        f"nvidia_{wheel}-*.dist-info",
                        f"nvidia_{wheel}_{sub}-*.dist-info",
                    ]
            for pat in patterns:
                try:
                    hits = sorted(site.glob(pat))
                except OSError:
                    hits = []
                if hits:
                    version = hits[0].name[: -len(".dist-info")].rsplit("-", 1)[-1]
                    break
            break
    _WHEEL_CACHE[path] = version
    return version


def scan_libraries(
    pids: Iterable[int],
    *,
    read_maps: Callable[[int], str | None] | None = None,
    names: Iterable[str] = LIBRARY_NAMES,
    proc_root: str = "/proc",
) -> dict[str, set[int]]:
    """``{library path: pids that map it}`` for the interesting libraries."""
    wanted = tuple(names)
    reader = read_maps or (lambda pid: _read_text(f"{proc_root}/{pid}/maps"))
    found: dict[str, set[int]] = {}
    for pid in pids:
        text = reader(pid)
        if not text:
            continue
        for path in mapped_objects(text):
            if classify_library(path, wanted) is not None:
                found.setdefault(path, set()).add(pid)
    return found


class LibraryScanner:
    """Scans the tree under ``root_pid`` every ``interval`` seconds until stopped."""

    def __init__(
        self,
        root_pid: int,
        *,
        interval: float = 2.0,
        proc_root: str = "/proc",
        read_maps: Callable[[int], str | None] | None = None,
        names: Iterable[str] = LIBRARY_NAMES,
    ) -> None:
        self.root_pid = root_pid
        self.interval = interval
        self._proc_root = proc_root
        self._read_maps = read_maps
        self._names = tuple(names)
        self._seen: dict[str, set[int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.scans = 0
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="kk3-libscan", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def scan_once(self) -> None:
        try:
            pids = process_tree(self.root_pid, self._proc_root)
            found = scan_libraries(
                pids, read_maps=self._read_maps, names=self._names, proc_root=self._proc_root
            )
        except Exception as exc:
            if len(self.errors) < 5:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            for path, pids_ in found.items():
                self._seen.setdefault(path, set()).update(pids_)
            self.scans += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.scan_once()
            self._stop.wait(self.interval)

    def libraries(self) -> list[LoadedLibrary]:
        with self._lock:
            seen = {k: set(v) for k, v in self._seen.items()}
        out: list[LoadedLibrary] = []
        for path, pids in seen.items():
            hit = classify_library(path, self._names)
            if hit is None:  # pragma: no cover - only matching paths are stored
                continue
            name, version = hit
            wheel = wheel_version(path)
            if wheel and (version is None or version.count(".") < wheel.count(".")):
                version = wheel
            out.append(LoadedLibrary(name, path, version, tuple(sorted(pids))))
        out.sort(key=lambda lib: (lib.name, lib.path))
        return out
