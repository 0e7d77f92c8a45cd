"""Group archives: the bundles of one multi-node launch in one tar (``kk3evidence merge``).

Layout (one top folder ``kk3group-<id>/``): ``group.json`` (schema
``schemas/group-archive.schema.json``: the group id and, per node, its member name, size and
sha256) first, then ``nodes/<node>.tar`` (or ``.tar.gz``), each a whole bundle copied byte for
byte. The outer tar is never compressed (the bundles inside may be).

Reading one from someone else: the outer tar is read through :class:`SafeTar` (bounded, no
links, no absolute names or ``..``, only the two kinds of member above, no duplicates); each
node bundle is copied into a private temporary folder while its sha256 is checked against
``group.json`` (the bundle stays a tar: nothing inside it is extracted), then opened with
:func:`open_bundle` like any bundle, which verifies it on its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from kk3evidence._version import __version__
from kk3evidence.bundle import schema as _schema
from kk3evidence.bundle.archive import open_bundle
from kk3evidence.bundle.tarsafe import CHUNK, ArchiveError, Limits, SafeTar, max_bundle_bytes
from kk3evidence.errors import BundleError, InputError

GROUP_ARCHIVE_SCHEMA = "kk3evidence/group-archive/v1"
INDEX = "group.json"
_NODE_RE = re.compile(r"^nodes/[A-Za-z0-9][A-Za-z0-9._-]{0,63}\.(tar|tar\.gz|tgz)$")
_TOP_RE = re.compile(r"^kk3group-[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _sha256(path: Path) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def _suffix(path: Path) -> str:
    name = path.name.lower()
    return ".tar.gz" if name.endswith(".tar.gz") else ".tgz" if name.endswith(".tgz") else ".tar"


def write_group_archive(
    paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]
) -> Path:
    """Verify each bundle, then write them with an index into ``out`` (atomically)."""
    if len(paths) < 2:
        raise InputError("merge needs the bundles of at least two nodes")
    nodes: list[dict[str, Any]] = []
    ids: set[str | None] = set()
    for i, p in enumerate(paths):
        path = Path(p)
        with open_bundle(path) as b:  # refuses anything invalid
            group = b.group or {}
            rank = group.get("node_rank")
            gid = group.get("id")
            ids.add(gid if isinstance(gid, str) else None)
            bundle_id = b.bundle_id
        node = f"node{rank}" if isinstance(rank, int) else f"node{i}"
        if any(n["node"] == node for n in nodes):
            node = f"node{i}-{bundle_id[-8:]}"
        size, sha = _sha256(path)
        nodes.append(
            {
                "node": node,
                "rank": rank if isinstance(rank, int) else None,
                "bundle_id": bundle_id,
                "member": f"nodes/{node}{_suffix(path)}",
                "size": size,
                "sha256": sha,
                "source": path.name,
                "_path": path,
            }
        )
    gid = next(iter(ids)) if len(ids) == 1 else None
    index = {
        "schema": GROUP_ARCHIVE_SCHEMA,
        "group_id": gid,
        "created": datetime.now(UTC).isoformat(),
        "tool": {"name": "kk3evidence", "version": __version__},
        "nodes": [{k: v for k, v in n.items() if k != "_path"} for n in nodes],
    }
    problems = list(_schema.iter_schema_problems("group-archive", index, INDEX))
    if problems:
        raise BundleError(f"cannot write the group archive: {problems[0]}", list(problems))
    return _write_tar(Path(out), f"kk3group-{gid or 'mixed'}", index, nodes)


def _write_tar(out: Path, top: str, index: dict[str, Any], nodes: list[dict[str, Any]]) -> Path:
    partial = out.with_name(out.name + ".partial")
    data = json.dumps(index, indent=2, ensure_ascii=False).encode() + b"\n"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
            info = tarfile.TarInfo(f"{top}/{INDEX}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, _BytesReader(data))
            for n in nodes:
                info = tarfile.TarInfo(f"{top}/{n['member']}")
                info.size, info.mode = n["size"], 0o644
                with open(n["_path"], "rb") as fh:
                    tar.addfile(info, fh)
        os.replace(partial, out)
    except OSError as exc:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise BundleError(f"cannot write {out}: {exc.strerror or exc}") from None
    return out


class _BytesReader:
    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._data) if n < 0 else self._pos + n
        out = bytes(self._data[self._pos : end])
        self._pos += len(out)
        return out


def _group_limits() -> Limits:
    """A group archive holds several node bundles, each opened later under the per-bundle
    limits: the archive itself may be as large as 16 of them (and at least 64 GiB, as before
    the per-bundle limit was lowered)."""
    total = max(64 * 2**30, 16 * max_bundle_bytes())
    return Limits(max_total_bytes=total, max_member_bytes=total)


def is_group_archive(path: str | os.PathLike[str]) -> bool:
    """True when the first member of the (plain) tar at ``path`` is ``kk3group-*/group.json``."""
    try:
        with SafeTar(Path(path), _group_limits()) as tar:
            if tar.compression != "tar":
                return False
            first = next(tar.headers(), None)
    except (ArchiveError, OSError):
        return False
    if first is None:
        return False
    parts = PurePosixPath(first.name).parts
    return len(parts) == 2 and bool(_TOP_RE.match(parts[0])) and parts[1] == INDEX


def _member(name: str, top: str | None) -> tuple[str, str]:
    parts = PurePosixPath(name).parts
    if name.startswith("/") or ".." in parts or len(parts) < 2 or not _TOP_RE.match(parts[0]):
        raise BundleError(f"group archive member {name[:120]!r} is outside kk3group-*/")
    if top is not None and parts[0] != top:
        raise BundleError("group archive has two top folders; it was not written by merge")
    return parts[0], "/".join(parts[1:])


@contextlib.contextmanager
def opened_group_archive(path: str | os.PathLike[str]) -> Iterator[list[str]]:
    """Yield the node bundles of a group archive as file paths (verified copies in a private
    temporary folder, removed afterwards), in the index's order."""
    src = Path(path)
    try:
        with _verified_copies(src) as paths:
            yield paths
    except ArchiveError as exc:
        raise BundleError(f"{src}: {exc.message}") from None


@contextlib.contextmanager
def _verified_copies(src: Path) -> Iterator[list[str]]:
    with (
        tempfile.TemporaryDirectory(prefix="kk3group-") as tmp,
        SafeTar(src, _group_limits()) as tar,
    ):
        index: dict[str, Any] | None = None
        top: str | None = None
        copied: dict[str, Path] = {}
        for info in tar.headers():
            top, rel = _member(info.name, top)
            if not info.isfile():
                raise BundleError(f"{src}: {rel} is not a regular file in the group archive")
            if rel == INDEX and index is None:
                index = _read_index(tar, info, src)
            elif index is not None and _NODE_RE.match(rel) and rel not in copied:
                copied[rel] = _copy(tar, info, rel, index=index, tmp=Path(tmp), src=src)
            else:
                raise BundleError(f"{src}: unexpected or repeated member {rel[:120]!r}")
        if index is None:
            raise BundleError(f"{src}: not a group archive (no {INDEX})")
        missing = [n["member"] for n in index["nodes"] if n["member"] not in copied]
        if missing:
            raise BundleError(f"{src}: group archive lacks {', '.join(missing)}")
        yield [str(copied[n["member"]]) for n in index["nodes"]]


def _read_index(tar: SafeTar, info: tarfile.TarInfo, src: Path) -> dict[str, Any]:
    if info.size > 16 * 1024 * 1024:
        raise BundleError(f"{src}: {INDEX} is too large")
    raw = b"".join(tar.read_data(info.offset_data, info.size))
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise BundleError(f"{src}: {INDEX} is not JSON ({exc})") from None
    problems = list(_schema.iter_schema_problems("group-archive", doc, INDEX))
    if problems:
        raise BundleError(f"{src}: {problems[0]}", list(problems))
    return dict(doc)


def _copy(
    tar: SafeTar, info: tarfile.TarInfo, rel: str, *, index: dict[str, Any], tmp: Path, src: Path
) -> Path:
    entry = next((n for n in index["nodes"] if n["member"] == rel), None)
    if entry is None or entry["size"] != info.size:
        raise BundleError(f"{src}: {rel} is not listed in {INDEX} with this size")
    dest = tmp / PurePosixPath(rel).name
    h = hashlib.sha256()
    with open(dest, "xb") as fh:
        for chunk in tar.read_data(info.offset_data, info.size):
            h.update(chunk)
            fh.write(chunk)
    if h.hexdigest() != entry["sha256"]:
        raise BundleError(f"{src}: {rel} does not match its sha256 in {INDEX}; the file changed")
    return dest
