"""Evidence bundles v1 (SPEC §3): write them, read them safely, validate them.

Reading (:func:`open_bundle`, :func:`iter_problems`, :func:`validate`) never extracts to disk,
never follows or creates links and never writes a file. A bundle is read in one streaming pass:
every header is checked (name, type, size) *before* its data is read, every member is hashed,
and JSON members (small, bounded) are kept in memory. Then the manifest is checked against what
was really there (every member listed, sizes and sha256 equal) and only verified JSON is
parsed and checked against its schema. Big members (logs) are not kept: :meth:`Bundle.open_member`
and :meth:`Bundle.iter_log_lines` stream them again and re-verify the sha256 at the end.

Writing (:class:`BundleWriter`) goes into a staging folder that mirrors the member tree plus a
``staging.json`` marker; :meth:`BundleWriter.finalize` hashes members by streaming, writes
``manifest.json`` last, and builds the tar in ``<out>.partial`` before an atomic rename.
:func:`seal` turns a staging folder left by a capture that died into a valid bundle.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, BinaryIO

from kk3evidence._version import __version__
from kk3evidence.bundle import schema as _schema
from kk3evidence.bundle.tarsafe import CHUNK, ArchiveError, Limits, SafeTar
from kk3evidence.errors import BundleError
from kk3evidence.model import Problem

if TYPE_CHECKING:
    from kk3evidence.bundle.redact import Redactor

__all__ = [
    "BUNDLE_SCHEMA",
    "OPTIONAL_MEMBERS",
    "REQUIRED_MEMBERS",
    "STAGING_MARKER",
    "Bundle",
    "BundleWriter",
    "Limits",
    "MemberInfo",
    "best_problem",
    "is_member_name",
    "is_staging_dir",
    "iter_problems",
    "open_bundle",
    "seal",
    "validate",
]

BUNDLE_SCHEMA = "kk3evidence/bundle/v1"
STAGING_SCHEMA = "kk3evidence/staging/v1"
STAGING_MARKER = "staging.json"
MANIFEST = "manifest.json"
# manifest.json cannot list itself: its "self_sha256" is the sha256 of its own bytes with that
# value replaced by 64 zeros, so any changed byte of the manifest is detected and named.
SELF_SHA256_RE = re.compile(rb'"self_sha256"\s*:\s*"([0-9a-f]{64})"')
_ZERO_SHA = "0" * 64
LOG_MEMBER = "logs/combined.log"
LINES_MEMBER = "logs/lines.tsv"
REQUIRED_MEMBERS: tuple[str, ...] = ("fingerprint.json", "launch.json", LOG_MEMBER)
OPTIONAL_MEMBERS: tuple[str, ...] = ("notes.json", "analysis.json")
EXTRA_FOLDERS: tuple[str, ...] = ("logs", "requests", "metrics", "probes", "stalls")

_MEMBER_RE = re.compile(
    r"^(?:(?:manifest|fingerprint|launch|notes|analysis)\.json"
    r"|(?:logs|requests|metrics|probes|stalls)(?:/[A-Za-z0-9_][A-Za-z0-9._-]*)+)$"
)
_TOP_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,254}$")
_BUNDLE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_METRICS_LABEL_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


def is_member_name(name: str) -> bool:
    """True if ``name`` (relative to the top folder) is an allowed v1 member name."""
    return len(name) <= 255 and _MEMBER_RE.match(name) is not None


def _show(name: str, limit: int = 120) -> str:
    """A member name safe to print on one line (control and odd bytes escaped)."""
    text = name.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace")
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# --- problems and relevance -----------------------------------------------------------------

_PRIORITY: dict[str, int] = {
    "not-found": 0,
    "not-a-file": 0,
    "empty-file": 0,
    "unreadable": 0,
    "not-tar": 1,
    "unsupported-compression": 1,
    "unsupported-version": 2,
    "compression-bomb": 3,
    "archive-too-large": 3,
    "header-too-large": 3,
    "too-many-members": 3,
    "absolute-path": 4,
    "path-traversal": 4,
    "link": 4,
    "special-file": 4,
    "bad-name": 4,
    "duplicate-member": 4,
    "member-too-large": 4,
    "truncated": 5,
    "corrupt-archive": 5,
    "trailing-data": 5,
    "missing-manifest": 6,
    "sha256-mismatch": 7,
    "size-mismatch": 7,
    "multiple-top-folders": 8,
    "outside-top-folder": 8,
    "unexpected-member": 8,
    "unlisted-member": 8,
    "missing-member": 8,
}


def best_problem(problems: Sequence[Problem]) -> Problem:
    """The most relevant problem (like ``jsonschema.exceptions.best_match``).

    Unreadable input first, then an unknown major version (it explains every schema
    mismatch), then safety, integrity, layout, and schema details last.
    """
    if not problems:
        raise ValueError("no problems")
    return min(enumerate(problems), key=lambda ip: (_PRIORITY.get(ip[1].code, 9), ip[0]))[1]


# --- reading --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """A verified member: name relative to the top folder, size, sha256, data offset."""

    name: str
    size: int
    sha256: str
    offset: int  # of the data in the uncompressed tar stream


@dataclass(frozen=True, slots=True)
class _FileId:
    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> _FileId:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(slots=True)
class _Seen:
    size: int
    sha256: str
    offset: int
    data: bytes | None  # kept for JSON members only


_CACHE_MEMBER_BYTES = 4 * 1024 * 1024
_CACHE_TOTAL_BYTES = 64 * 1024 * 1024


def _member_limit(name: str, limits: Limits) -> int:
    if name.endswith(".json"):
        return limits.max_json_bytes
    if name.startswith("metrics/"):
        return limits.max_text_bytes
    return limits.max_member_bytes


class _Scanner:
    """One streaming pass over a bundle; yields problems and keeps what a Bundle needs."""

    def __init__(self, path: str | os.PathLike[str], limits: Limits) -> None:
        self.path = Path(path)
        self.limits = limits
        self.top: str | None = None
        self.compression = "tar"
        self.seen: dict[str, _Seen] = {}
        self.manifest: dict[str, Any] | None = None
        self.documents: dict[str, Any] = {}
        self.file_id: _FileId | None = None
        self.manifest_corrupt = False

    def run(self) -> Iterator[Problem]:
        p = self.path
        try:
            st = p.stat()
        except FileNotFoundError:
            yield Problem("not-found", f"no such file: {_show(str(p))}")
            return
        except OSError as exc:
            yield Problem("unreadable", f"cannot read {_show(str(p))}: {exc.strerror}")
            return
        if p.is_dir():
            hint = (
                "; it looks like a capture's staging folder: run `kk3evidence seal` on it"
                if is_staging_dir(p)
                else ""
            )
            yield Problem("not-a-file", f"{_show(str(p))} is a directory, not a bundle{hint}")
            return
        if not p.is_file():
            yield Problem("not-a-file", f"{_show(str(p))} is not a regular file")
            return
        if st.st_size == 0:
            yield Problem("empty-file", "the file is empty (0 bytes); not a bundle")
            return
        self.file_id = _FileId.of(st)
        try:
            with SafeTar(p, self.limits) as tar:
                self.compression = tar.compression
                yield from self._scan_archive(tar)
        except ArchiveError as exc:
            yield Problem(exc.code, exc.message, member=exc.member)
            return
        if any(pr.code in _FATAL for pr in self._problems):
            return
        yield from self._check_manifest()

    # The archive pass ------------------------------------------------------------------------
    _problems: list[Problem]

    def _emit(self, problem: Problem) -> Problem:
        self._problems.append(problem)
        return problem

    def _scan_archive(self, tar: SafeTar) -> Iterator[Problem]:
        self._problems = []
        lim = self.limits
        count = 0
        total = 0
        tops: list[str] = []
        names: set[str] = set()
        folded_names: dict[str, str] = {}
        cached = 0
        json_total = 0
        for info in tar.headers():
            count += 1
            if count > lim.max_members:
                yield self._emit(
                    Problem(
                        "too-many-members",
                        f"the archive has more than {lim.max_members} members",
                        expected=f"<= {lim.max_members}",
                    )
                )
                return
            raw = info.name
            shown = _show(raw)
            if info.isdir() and raw.strip("/") in ("", "."):
                continue  # the "./" entry `tar -C dir .` writes
            problem, parts = self._check_name(raw, info)
            if problem is not None:
                yield self._emit(problem)
                continue
            # Types before data: nothing but regular files and folders.
            if info.issym() or info.islnk():
                kind = "symbolic" if info.issym() else "hard"
                yield self._emit(
                    Problem(
                        "link",
                        f"{kind} link to {_show(info.linkname)!r}; bundles may not contain links",
                        member=shown,
                    )
                )
                continue
            if info.size < 0:
                yield self._emit(
                    Problem(
                        "corrupt-archive", f"declares a negative size ({info.size})", member=shown
                    )
                )
                return
            if info.type == tarfile.GNUTYPE_SPARSE or info.sparse is not None:
                yield self._emit(
                    Problem(
                        "special-file",
                        "is a sparse file; bundles hold only regular files",
                        member=shown,
                    )
                )
                continue
            if not (info.isreg() or info.isdir()):
                what = (
                    "character device"
                    if info.ischr()
                    else "block device"
                    if info.isblk()
                    else "FIFO"
                    if info.isfifo()
                    else "sparse file"
                    if info.issparse()
                    else f"member of tar type {info.type.decode('latin-1')!r}"
                )
                yield self._emit(
                    Problem(
                        "special-file",
                        f"is a {what}; bundles hold only regular files",
                        member=shown,
                    )
                )
                continue
            top, rest = parts[0], "/".join(parts[1:])
            key = "/".join(parts)
            if key in names:
                yield self._emit(
                    Problem(
                        "duplicate-member", "appears more than once in the archive", member=shown
                    )
                )
                continue
            names.add(key)
            folded = key.casefold()
            if folded in folded_names:
                yield self._emit(
                    Problem(
                        "duplicate-member",
                        f"differs only in letter case from {_show(folded_names[folded])!r} "
                        "(they would collide on a case-insensitive file system)",
                        member=shown,
                    )
                )
                continue
            folded_names[folded] = key
            if not rest and not info.isdir():
                yield self._emit(
                    Problem(
                        "outside-top-folder",
                        "is not inside the bundle's top folder",
                        member=shown,
                    )
                )
                continue
            if top not in tops:
                tops.append(top)
                if len(tops) == 2:
                    yield self._emit(
                        Problem(
                            "multiple-top-folders",
                            f"the archive has more than one top folder ({_show(tops[0])!r} and "
                            f"{_show(top)!r}); a bundle has exactly one",
                            member=shown,
                        )
                    )
            if info.isdir():
                if rest and not (
                    parts[1] in EXTRA_FOLDERS and all(_TOP_RE.match(x) for x in parts[1:])
                ):
                    yield self._emit(
                        Problem("unexpected-member", "is not a v1 bundle folder", member=shown)
                    )
                continue
            if top != tops[0]:
                continue  # already reported
            if not is_member_name(rest):
                yield self._emit(
                    Problem(
                        "unexpected-member",
                        "is not a v1 bundle member (allowed: manifest.json, fingerprint.json, "
                        "launch.json, notes.json, analysis.json, logs/, requests/, metrics/, "
                        "probes/, stalls/)",
                        member=_show(rest),
                    )
                )
                continue
            limit = _member_limit(rest, lim)
            if info.size > limit:
                yield self._emit(
                    Problem(
                        "member-too-large",
                        f"is {info.size} bytes, over the {limit}-byte limit for this member",
                        member=rest,
                        expected=f"<= {limit}",
                        actual=str(info.size),
                    )
                )
                continue
            if rest.endswith(".json"):
                json_total += info.size
                if json_total > lim.max_json_total_bytes:
                    yield self._emit(
                        Problem(
                            "archive-too-large",
                            f"JSON members add up to more than {lim.max_json_total_bytes} bytes",
                            member=rest,
                        )
                    )
                    return
            total += info.size
            if total > lim.max_total_bytes:
                yield self._emit(
                    Problem(
                        "archive-too-large",
                        f"members add up to more than {lim.max_total_bytes} bytes",
                        member=rest,
                    )
                )
                return
            digest = hashlib.sha256()
            # JSON is parsed after the pass; small metrics are kept so metrics() need not
            # decompress the archive again.
            keep = rest.endswith(".json") or (
                rest.startswith("metrics/")
                and info.size <= _CACHE_MEMBER_BYTES
                and cached + info.size <= _CACHE_TOTAL_BYTES
            )
            if keep and not rest.endswith(".json"):
                cached += info.size
            chunks: list[bytes] = []
            try:
                for chunk in tar.read_data(info.offset_data, info.size):
                    digest.update(chunk)
                    if keep:
                        chunks.append(chunk)
            except ArchiveError as exc:
                yield self._emit(Problem(exc.code, exc.message, member=rest))
                return
            got = digest.hexdigest()
            self.seen[rest] = _Seen(
                info.size, got, info.offset_data, b"".join(chunks) if keep else None
            )
            if rest == MANIFEST and keep:
                problem = _check_self_sha256(self.seen[rest].data or b"")
                if problem is not None:
                    self.manifest_corrupt = True
                    yield self._emit(problem)
        if tops:
            self.top = tops[0]
        try:
            tar.check_end()
        except ArchiveError as exc:
            member = exc.member
            if member is not None and self.top and member.startswith(self.top + "/"):
                member = member[len(self.top) + 1 :]
            yield self._emit(Problem(exc.code, exc.message, member=member))
            return
        if count == 0:
            yield self._emit(Problem("not-tar", "the archive has no members; not a bundle"))

    def _check_name(self, raw: str, info: tarfile.TarInfo) -> tuple[Problem | None, list[str]]:
        shown = _show(raw)
        try:
            encoded = raw.encode("utf-8")
        except UnicodeEncodeError:
            return Problem("bad-name", "member name is not valid UTF-8", member=shown), []
        if len(encoded) > self.limits.max_name_bytes:
            return (
                Problem(
                    "bad-name",
                    f"member name is {len(encoded)} bytes long "
                    f"(limit {self.limits.max_name_bytes})",
                    member=shown[:80] + "…",
                ),
                [],
            )
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
            return Problem("bad-name", "member name contains control characters", member=shown), []
        if raw.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", raw):
            return (
                Problem(
                    "absolute-path", "absolute path; bundle members must be relative", member=shown
                ),
                [],
            )
        if "\\" in raw:
            return Problem("bad-name", "member name contains a backslash", member=shown), []
        name = raw
        while name.startswith("./"):
            name = name[2:]
        if info.isdir():
            name = name.rstrip("/")
        parts = name.split("/")
        if ".." in parts:
            return (
                Problem(
                    "path-traversal",
                    "member name contains '..' and would escape the bundle folder",
                    member=shown,
                ),
                [],
            )
        if not name or any(x in ("", ".") for x in parts):
            return (
                Problem("bad-name", "member name has an empty or '.' component", member=shown),
                [],
            )
        if not _TOP_RE.match(parts[0]):
            return (
                Problem("bad-name", "the top folder name has unexpected characters", member=shown),
                [],
            )
        return None, parts

    # Manifest and documents ------------------------------------------------------------------
    def _check_manifest(self) -> Iterator[Problem]:
        lim = self.limits
        seen = self.seen
        if MANIFEST not in seen:
            yield Problem(
                "missing-manifest",
                "the bundle has no manifest.json in its top folder; not a kk3evidence bundle",
                member=MANIFEST,
            )
            return
        if self.manifest_corrupt:
            return  # already reported; nothing in it can be trusted
        data = seen[MANIFEST].data or b""
        manifest, problems = _schema.parse_json(
            data, MANIFEST, max_depth=lim.max_json_depth, max_nodes=lim.max_json_nodes
        )
        if problems:
            yield from problems
            return
        vp = _schema.version_problem(manifest, "manifest", MANIFEST)
        if vp is not None:
            yield vp
            return
        entries_value = manifest.get("members") if isinstance(manifest, dict) else None
        if isinstance(entries_value, list) and len(entries_value) > lim.max_members:
            yield Problem(
                "too-many-members",
                f"manifest.json lists {len(entries_value)} members (limit {lim.max_members})",
                member=MANIFEST,
                json_path="$.members",
                expected=f"<= {lim.max_members}",
                actual=str(len(entries_value)),
            )
            return
        schema_problems = list(_schema.iter_schema_problems("manifest", manifest, MANIFEST))
        yield from schema_problems
        if not isinstance(manifest, dict):
            return
        self.manifest = manifest
        listed: dict[str, tuple[int | None, str | None]] = {}
        entries = manifest.get("members")
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                continue
            name = entry["name"]
            if name in listed:
                yield Problem(
                    "duplicate-member",
                    "is listed more than once in manifest.json",
                    member=_show(name),
                    json_path=f"$.members[{i}].name",
                )
                continue
            size = entry.get("size")
            sha = entry.get("sha256")
            if isinstance(size, float) and size.is_integer():
                size = int(size)  # 12.0 is an integer to JSON Schema too
            listed[name] = (
                size if isinstance(size, int) and not isinstance(size, bool) else None,
                sha if isinstance(sha, str) else None,
            )
        if MANIFEST in listed:
            yield Problem(
                "unexpected-member",
                "manifest.json lists itself; it lists every other member",
                member=MANIFEST,
                json_path="$.members",
            )
        verified: set[str] = set()
        for name, got in seen.items():
            if name == MANIFEST:
                continue
            if name not in listed:
                yield Problem(
                    "unlisted-member",
                    "is in the archive but not listed in manifest.json",
                    member=name,
                )
                continue
            size, sha = listed[name]
            if size is not None and size != got.size:
                yield Problem(
                    "size-mismatch",
                    f"is {got.size} bytes but manifest.json says {size} (corrupt or altered)",
                    member=name,
                    expected=str(size),
                    actual=str(got.size),
                )
                continue
            if sha is not None and sha != got.sha256:
                yield Problem(
                    "sha256-mismatch",
                    "content does not match its sha256 in manifest.json (corrupt or altered)",
                    member=name,
                    expected=sha,
                    actual=got.sha256,
                )
                continue
            if size is not None and sha is not None:
                verified.add(name)
        for name in listed:
            if name != MANIFEST and name not in seen:
                yield Problem(
                    "missing-member",
                    "is listed in manifest.json but not in the archive",
                    member=_show(name),
                )
        for name in REQUIRED_MEMBERS:
            if name not in seen and name not in listed:
                yield Problem("missing-member", "required member is missing", member=name)
        # Only verified JSON is parsed and trusted.
        for name in sorted(verified):
            stem = _schema.schema_for_member(name)
            if stem is None:
                continue
            doc, problems = _schema.parse_json(
                seen[name].data or b"",
                name,
                max_depth=lim.max_json_depth,
                max_nodes=lim.max_json_nodes,
            )
            if problems:
                yield from problems
                continue
            vp = _schema.version_problem(doc, stem, name)
            if vp is not None:
                yield vp
                continue
            yield from _schema.iter_schema_problems(stem, doc, name)
            self.documents[name] = doc
        for name, got in seen.items():
            if name.endswith(".json"):
                got.data = None  # parsed documents are kept; raw JSON bytes are not


_FATAL = frozenset(
    {
        "too-many-members",
        "archive-too-large",
        "compression-bomb",
        "header-too-large",
        "truncated",
        "corrupt-archive",
        "not-tar",
        "unreadable",
    }
)


def iter_problems(
    path: str | os.PathLike[str], *, limits: Limits | None = None
) -> Iterator[Problem]:
    """Yield every problem found in the bundle at ``path``, located, in the order found.

    Never raises for bad input and never writes anything. An empty iteration means valid.
    """
    yield from _Scanner(path, limits or Limits()).run()


def validate(path: str | os.PathLike[str], *, limits: Limits | None = None) -> list[Problem]:
    """Every problem in the bundle at ``path`` (an empty list means valid)."""
    return list(iter_problems(path, limits=limits))


def _error_for(path: Path, problems: list[Problem]) -> BundleError:
    best = best_problem(problems)
    more = len(problems) - 1
    tail = (
        f" (and {more} more problem{'s' if more != 1 else ''}; run `kk3evidence validate`)"
        if more
        else ""
    )
    return BundleError(f"{_show(str(path))}: {best}{tail}", list(problems))


class _VerifiedStream(io.RawIOBase):
    """One member's bytes from the archive; checks size and sha256 when the end is read."""

    def __init__(self, tar: SafeTar, info: MemberInfo, bundle_path: Path) -> None:
        super().__init__()
        self._tar = tar
        self._info = info
        self._left = info.size
        self._digest = hashlib.sha256()
        self._bundle_path = bundle_path
        self._checked = False
        tar.seek(info.offset)

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        if self._left <= 0:
            self._finish()
            return 0
        want = min(len(b), self._left, CHUNK)
        try:
            data = self._tar.read(want)
        except ArchiveError as exc:
            raise BundleError(
                f"{_show(str(self._bundle_path))}: {self._info.name}: {exc.message}"
            ) from None
        if not data:
            raise BundleError(
                f"{_show(str(self._bundle_path))}: {self._info.name}: archive ends early "
                "(changed since it was opened?)"
            )
        n = len(data)
        memoryview(b)[:n] = data
        self._digest.update(data)
        self._left -= n
        return n

    def _finish(self) -> None:
        if self._checked:
            return
        self._checked = True
        if self._digest.hexdigest() != self._info.sha256:
            raise BundleError(
                f"{_show(str(self._bundle_path))}: {self._info.name}: content does not match "
                "its sha256 in manifest.json (the file changed since it was opened?)"
            )

    def close(self) -> None:
        if not self.closed:
            self._tar.close()
        super().close()


class Bundle:
    """A verified bundle. Use :func:`open_bundle`; close it (or use ``with``) when done.

    ``manifest``, ``fingerprint``, ``launch``, ``notes`` and ``analysis`` are the parsed,
    hash-verified, schema-valid JSON members (``None`` when absent). Big members are streamed
    with :meth:`open_member` / :meth:`iter_log_lines`, which re-check the sha256 at the end.
    """

    def __init__(self, scan: _Scanner) -> None:
        assert scan.manifest is not None and scan.file_id is not None
        self.path: Path = scan.path
        self.limits: Limits = scan.limits
        self.compression: str = scan.compression
        self.top_folder: str = scan.top or ""
        self.manifest: dict[str, Any] = scan.manifest
        docs = scan.documents
        self.fingerprint: dict[str, Any] | None = docs.get("fingerprint.json")
        self.launch: dict[str, Any] | None = docs.get("launch.json")
        self.notes: dict[str, Any] | None = docs.get("notes.json")
        self.analysis: dict[str, Any] | None = docs.get("analysis.json")
        self._documents: dict[str, Any] = docs
        self._members: dict[str, MemberInfo] = {
            name: MemberInfo(name, s.size, s.sha256, s.offset)
            for name, s in scan.seen.items()
            if name != MANIFEST
        }
        # Small verified members kept from the scan (metrics): no second decompression.
        self._cached: dict[str, bytes] = {
            name: s.data
            for name, s in scan.seen.items()
            if s.data is not None and not name.endswith(".json")
        }
        self._file_id = scan.file_id
        self.closed = False

    # context manager -------------------------------------------------------------------
    def __enter__(self) -> Bundle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.closed = True

    def __repr__(self) -> str:
        return f"<Bundle {self.bundle_id} {str(self.path)!r}>"

    # metadata --------------------------------------------------------------------------
    @property
    def bundle_id(self) -> str:
        return str(self.manifest.get("bundle_id", ""))

    @property
    def schema_version(self) -> str:
        return str(self.manifest.get("schema", ""))

    @property
    def redactions(self) -> list[dict[str, Any]]:
        return list(self.manifest.get("redactions", []))

    @property
    def not_collected(self) -> list[dict[str, Any]]:
        return list(self.manifest.get("not_collected", []))

    def names(self) -> list[str]:
        """Member names (relative to the top folder), manifest.json excluded, sorted."""
        return sorted(self._members)

    def has(self, name: str) -> bool:
        return name in self._members

    def member(self, name: str) -> MemberInfo:
        try:
            return self._members[name]
        except KeyError:
            raise BundleError(f"{_show(str(self.path))}: no member {_show(name)!r}") from None

    def json(self, name: str) -> Any:
        """A verified JSON member (``None`` if absent)."""
        return self._documents.get(name)

    def requests(self) -> list[dict[str, Any]]:
        """Every ``requests/*.json`` record, ordered by member name."""
        return [
            self._documents[n]
            for n in sorted(self._documents)
            if n.startswith("requests/") and n.endswith(".json")
        ]

    def metrics_labels(self) -> list[str]:
        return [
            n[len("metrics/") : -len(".prom")]
            for n in self.names()
            if n.startswith("metrics/") and n.endswith(".prom") and n.count("/") == 1
        ]

    def metrics(self, label: str) -> str | None:
        """The Prometheus text of ``metrics/<label>.prom`` (``None`` if absent)."""
        if not _METRICS_LABEL_RE.match(label):
            return None
        name = f"metrics/{label}.prom"
        if name not in self._members:
            return None
        return self.read_bytes(name).decode("utf-8", errors="replace")

    # streaming -------------------------------------------------------------------------
    def open_member(self, name: str) -> BinaryIO:
        """A binary stream of member ``name``; raises BundleError at the end if it changed."""
        if self.closed:
            raise BundleError(f"{_show(str(self.path))}: the bundle is closed")
        info = self.member(name)
        try:
            st = self.path.stat()
        except OSError as exc:
            raise BundleError(f"{_show(str(self.path))}: cannot read: {exc.strerror}") from None
        if _FileId.of(st) != self._file_id:
            raise BundleError(
                f"{_show(str(self.path))}: the file changed since it was opened; open it again"
            )
        try:
            tar = SafeTar(self.path, self.limits)
        except ArchiveError as exc:
            raise BundleError(f"{_show(str(self.path))}: {exc.message}") from None
        try:
            raw = _VerifiedStream(tar, info, self.path)
        except ArchiveError as exc:
            tar.close()
            raise BundleError(f"{_show(str(self.path))}: {name}: {exc.message}") from None
        return io.BufferedReader(raw, buffer_size=CHUNK)

    def read_bytes(self, name: str) -> bytes:
        """A whole member in memory (for small members; logs should be streamed)."""
        if name in self._cached:
            return self._cached[name]
        with self.open_member(name) as fp:
            return fp.read()

    def iter_log_lines(self, name: str = LOG_MEMBER) -> Iterator[bytes]:
        """Raw lines of ``logs/combined.log`` as bytes, each with its ``b"\\n"`` (the last may
        lack it). Only ``\\n`` ends a line (``\\r`` stays inside). A line longer than
        ``limits.max_line_bytes`` comes out in pieces of that size. Streams; the sha256 is
        checked when the end is reached.
        """
        if name not in self._members:
            return
        max_line = self.limits.max_line_bytes
        with self.open_member(name) as fp:
            # BufferedReader.readline splits on b"\n" only, in C; the limit caps huge lines.
            while line := fp.readline(max_line):
                yield line


def open_bundle(path: str | os.PathLike[str], *, limits: Limits | None = None) -> Bundle:
    """Open and verify the bundle at ``path`` (``.tar`` / ``.tar.gz``) without extracting it.

    Every member is streamed once: safety checks, sizes and sha256 against the manifest, JSON
    schemas. Raises :class:`~kk3evidence.errors.BundleError` (``.problems`` lists them all; the
    message is the most relevant one) if anything is wrong.
    """
    scan = _Scanner(path, limits or Limits())
    problems = list(scan.run())
    if problems:
        raise _error_for(Path(path), problems)
    return Bundle(scan)


# --- writing --------------------------------------------------------------------------------


def is_staging_dir(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` is a folder with a kk3evidence ``staging.json`` marker."""
    marker = Path(path) / STAGING_MARKER
    try:
        if not marker.is_file() or marker.stat().st_size > 16 * 1024 * 1024:
            return False
        data = json.loads(marker.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("schema") == STAGING_SCHEMA


def _dict_list(state: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    value = state.get(key, [])
    if not isinstance(value, list) or not all(isinstance(x, dict) for x in value):
        raise ValueError(f"{key!r} is not a list of objects")
    return [dict(x) for x in value]


def _check_writer_name(member: str) -> str:
    if not isinstance(member, str) or not is_member_name(member):
        raise BundleError(
            f"{member!r} is not a valid bundle member name (allowed: fingerprint.json, "
            "launch.json, notes.json, analysis.json, logs/…, requests/…, metrics/…, probes/…, "
            "stalls/…)"
        )
    if member == MANIFEST:
        raise BundleError("manifest.json is written by finalize(), not by hand")
    return member


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fp:
        fp.write(data)
        fp.flush()
        os.fsync(fp.fileno())
    os.replace(tmp, path)


def _dumps(obj: Any) -> bytes:
    try:
        text = json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise BundleError(f"cannot write JSON: {exc}") from None
    return (text + "\n").encode("utf-8")


class BundleWriter:
    """Build a bundle in a staging folder, then :meth:`finalize` it into a tar atomically.

    The staging folder mirrors the member tree (``launch.json``, ``logs/combined.log``, …) and
    holds a ``staging.json`` marker with the bundle id, what was not collected, losses and the
    redaction records so far; if the process dies, :func:`seal` turns it into a bundle.

    ``write_json`` validates against the member's schema and raises :class:`BundleError` on a
    mismatch (a bug in the caller; catch it and record the member with
    :meth:`add_not_collected`). A good habit for crash safety: write ``launch.json`` as soon as
    the command starts (``ended_at``/``exit_code`` null) and overwrite it at the end.
    """

    def __init__(
        self,
        staging_dir: str | os.PathLike[str],
        *,
        bundle_id: str | None = None,
        created: datetime | None = None,
        redactor: Redactor | None = None,
        tool_version: str = __version__,
    ) -> None:
        self.staging_dir = Path(staging_dir)
        self.redactor = redactor
        self._streams: list[BinaryIO] = []
        marker = self.staging_dir / STAGING_MARKER
        if marker.exists():
            if not is_staging_dir(self.staging_dir):
                raise BundleError(f"{_show(str(marker))} exists but is not a kk3evidence marker")
            try:
                state = json.loads(marker.read_bytes())
                self.bundle_id = str(state["bundle_id"])
                if not _BUNDLE_ID_RE.match(self.bundle_id):
                    raise ValueError("bad bundle id")
                self.created = _parse_iso(str(state["created"]))
                tool = state.get("tool")
                self._tool_version = str(
                    tool.get("version", tool_version) if isinstance(tool, dict) else tool_version
                )
                self._not_collected: list[dict[str, str]] = _dict_list(state, "not_collected")
                self._losses: list[dict[str, Any]] = _dict_list(state, "losses")
                self._redactions: list[dict[str, Any]] = _dict_list(state, "redactions")
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise BundleError(
                    f"{_show(str(marker))} is damaged ({type(exc).__name__}: {exc}); "
                    "cannot resume this staging folder"
                ) from None
            return
        if self.staging_dir.exists() and (
            not self.staging_dir.is_dir() or any(self.staging_dir.iterdir())
        ):
            raise BundleError(
                f"staging folder {_show(str(self.staging_dir))} exists and is not empty; "
                "use a new folder (or `kk3evidence seal` it if a capture died)"
            )
        self.created = (created or _utcnow()).astimezone(UTC)
        self.bundle_id = bundle_id or (f"{self.created:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}")
        if not _BUNDLE_ID_RE.match(self.bundle_id):
            raise BundleError(f"bad bundle id {self.bundle_id!r}")
        self._tool_version = tool_version
        self._not_collected = []
        self._losses = []
        self._redactions = []
        try:
            self.staging_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BundleError(
                f"cannot create staging folder {_show(str(self.staging_dir))}: {exc.strerror}"
            ) from None
        self._save_state()

    @classmethod
    def resume(cls, staging_dir: str | os.PathLike[str], **kwargs: Any) -> BundleWriter:
        """Reopen an existing staging folder (it must carry a ``staging.json`` marker)."""
        if not is_staging_dir(staging_dir):
            raise BundleError(
                f"{_show(str(staging_dir))} is not a kk3evidence staging folder "
                "(no valid staging.json)"
            )
        return cls(staging_dir, **kwargs)

    # state -----------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        redactions = self.redactor.records() if self.redactor is not None else self._redactions
        return {
            "schema": STAGING_SCHEMA,
            "bundle_id": self.bundle_id,
            "created": _iso(self.created),
            "tool": {"name": "kk3evidence", "version": self._tool_version},
            "not_collected": self._not_collected,
            "losses": self._losses,
            "redactions": redactions,
        }

    def _save_state(self) -> None:
        _atomic_write(self.staging_dir / STAGING_MARKER, _dumps(self._state()))

    def checkpoint(self) -> None:
        """Save redaction records etc. into ``staging.json`` (done by every write_json)."""
        self._save_state()

    def path_of(self, member: str) -> Path:
        """Where ``member`` lives in the staging folder."""
        return self.staging_dir / _check_writer_name(member)

    # members ---------------------------------------------------------------------------
    def write_json(self, member: str, obj: Any, *, validate: bool = True) -> None:
        """Write a JSON member atomically (replacing any earlier version)."""
        path = self.path_of(member)
        data = _dumps(obj)
        stem = _schema.schema_for_member(member)
        if validate and stem is not None:
            problems = list(_schema.iter_schema_problems(stem, json.loads(data), member))
            if problems:
                raise BundleError(
                    f"refusing to write {member}: {problems[0]}"
                    + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
                    list(problems),
                )
        _atomic_write(path, data)
        self._save_state()

    def add_bytes(self, member: str, data: bytes) -> None:
        """Write a whole member atomically (replacing any earlier version)."""
        if _schema.schema_for_member(member) is not None:
            raise BundleError(f"{member} is a JSON member: use write_json()")
        _atomic_write(self.path_of(member), bytes(data))

    def open_stream(self, member: str) -> BinaryIO:
        """Open member ``member`` for appending bytes (e.g. the combined log).

        The caller writes and flushes as it goes; nothing is held in memory here. Streams
        still open at :meth:`finalize` are flushed and closed.
        """
        if _schema.schema_for_member(member) is not None:
            raise BundleError(f"{member} is a JSON member: use write_json()")
        path = self.path_of(member)
        path.parent.mkdir(parents=True, exist_ok=True)
        fp: BinaryIO = open(path, "ab")  # noqa: SIM115 - handed to the caller
        self._streams.append(fp)
        return fp

    def add_not_collected(self, what: str, reason: str) -> None:
        """Record that ``what`` could not be collected, and why (saved immediately)."""
        self._not_collected.append({"what": str(what), "reason": " ".join(str(reason).split())})
        self._save_state()

    def add_loss(
        self, member: str | None, reason: str, *, bytes: int | None = None, lines: int | None = None
    ) -> None:
        """Record bytes/lines lost (e.g. a write error) so readers know a log is incomplete."""
        self._losses.append(
            {
                "member": member,
                "reason": reason,
                "bytes": bytes,
                "lines": lines,
                "at": _iso(_utcnow()),
            }
        )
        self._save_state()

    # finalize --------------------------------------------------------------------------
    def _close_streams(self) -> None:
        for fp in self._streams:
            with contextlib.suppress(OSError, ValueError):
                if not fp.closed:
                    fp.flush()
                    fp.close()
        self._streams.clear()

    def _walk(self, *, lenient: bool) -> list[str]:
        members: list[str] = []
        root = self.staging_dir
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            base = Path(dirpath)
            for d in list(dirnames):
                if (base / d).is_symlink():
                    rel = (base / d).relative_to(root).as_posix()
                    if not lenient:
                        raise BundleError(f"staging folder holds a symlink {rel!r}; refusing it")
                    self.add_not_collected(rel, "was a symbolic link in the staging folder")
                    dirnames.remove(d)
            for fn in sorted(filenames):
                full = base / fn
                rel = full.relative_to(root).as_posix()
                if rel in (STAGING_MARKER, MANIFEST) or fn.startswith("."):
                    continue
                if full.is_symlink() or not full.is_file():
                    if not lenient:
                        raise BundleError(f"staging folder holds {rel!r}, not a regular file")
                    self.add_not_collected(rel, "was not a regular file in the staging folder")
                    continue
                if not is_member_name(rel):
                    if not lenient:
                        raise BundleError(f"staging folder holds {rel!r}, not a bundle member")
                    self.add_not_collected(rel, "is not a bundle member name; left out")
                    continue
                members.append(rel)
        return members

    def _stub_missing(self, present: set[str], *, sealed: bool) -> None:
        why = (
            "capture did not finish; sealed from its staging folder"
            if sealed
            else "not written by the capture"
        )
        if "fingerprint.json" not in present:
            _atomic_write(self.staging_dir / "fingerprint.json", _dumps(_stub_fingerprint(why)))
            self.add_not_collected("fingerprint.json", why)
        if "launch.json" not in present:
            _atomic_write(self.staging_dir / "launch.json", _dumps(_stub_launch(self.created, why)))
            self.add_not_collected("launch.json", why)
        if LOG_MEMBER not in present:
            _atomic_write(self.staging_dir / LOG_MEMBER, b"")
            self.add_not_collected(LOG_MEMBER, f"no output was captured ({why})")

    def _check_json_members(self, members: list[str], *, lenient: bool) -> list[str]:
        kept: list[str] = []
        for name in members:
            stem = _schema.schema_for_member(name)
            if stem is None:
                kept.append(name)
                continue
            path = self.staging_dir / name
            data = path.read_bytes() if path.stat().st_size <= Limits().max_json_bytes else None
            problems: list[Problem]
            if data is None:
                problems = [Problem("member-too-large", "JSON member is too large", member=name)]
            else:
                doc, problems = _schema.parse_json(data, name)
                if not problems:
                    problems = list(_schema.iter_schema_problems(stem, doc, name))
            if not problems:
                kept.append(name)
                continue
            if not lenient:
                raise BundleError(f"cannot finalize: {problems[0]}", list(problems))
            # Keep the bytes for a human, out of the schema's way.
            target = f"probes/unsealed-{name.replace('/', '-')}"
            (self.staging_dir / "probes").mkdir(exist_ok=True)
            os.replace(path, self.staging_dir / target)
            self.add_not_collected(name, f"was invalid ({problems[0].message}); kept as {target}")
            kept.append(target)
        return kept

    def finalize(
        self,
        out_path: str | os.PathLike[str],
        *,
        redactions: Iterable[Mapping[str, Any]] | None = None,
        remove_staging: bool = True,
        _sealed: bool = False,
    ) -> Path:
        """Write the bundle to ``out_path`` atomically and return its path.

        Gzip-compressed when the name ends in ``.tar.gz`` or ``.tgz``. Missing required members
        get minimal valid stubs, recorded under ``not_collected``. The staging folder is
        removed afterwards unless ``remove_staging=False``.
        """
        out = Path(out_path)
        self._close_streams()
        present = set(self._walk(lenient=_sealed))
        self._stub_missing(present, sealed=_sealed)
        members = self._walk(lenient=_sealed)
        members = self._check_json_members(members, lenient=_sealed)
        members = sorted(set(members), key=_member_sort_key)
        entries = []
        for name in members:
            size, sha = _hash_file(self.staging_dir / name)
            entries.append({"name": name, "size": size, "sha256": sha})
        if redactions is not None:
            red = [dict(r) for r in redactions]
        elif self.redactor is not None:
            red = self.redactor.records()
        else:
            red = list(self._redactions)
        if _sealed:
            red = _merge_found_placeholders(red, self.staging_dir, members)
        manifest = {
            "schema": BUNDLE_SCHEMA,
            "self_sha256": _ZERO_SHA,
            "tool": {"name": "kk3evidence", "version": self._tool_version},
            "bundle_id": self.bundle_id,
            "created": _iso(self.created),
            "members": entries,
            "not_collected": self._not_collected,
            "redactions": red,
            "losses": self._losses,
            "sealed_from_staging": _sealed,
        }
        problems = list(_schema.iter_schema_problems("manifest", manifest, MANIFEST))
        if problems:
            raise BundleError(f"cannot finalize: {problems[0]}", list(problems))
        manifest_bytes = _seal_self_sha256(_dumps(manifest))
        _atomic_write(self.staging_dir / MANIFEST, manifest_bytes)
        self._write_tar(out, [MANIFEST, *members])
        if remove_staging:
            shutil.rmtree(self.staging_dir, ignore_errors=True)
        return out

    def _write_tar(self, out: Path, members: list[str]) -> None:
        top = f"kk3-{self.bundle_id}"
        mtime = int(self.created.timestamp())
        gz = out.name.endswith((".tar.gz", ".tgz"))
        partial = out.with_name(out.name + ".partial")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            with open(partial, "wb") as raw:
                stream: BinaryIO = raw
                gzf: gzip.GzipFile | None = None
                if gz:
                    gzf = gzip.GzipFile(
                        filename="", mode="wb", fileobj=raw, mtime=mtime, compresslevel=6
                    )
                    stream = gzf  # type: ignore[assignment]
                with tarfile.open(fileobj=stream, mode="w", format=tarfile.PAX_FORMAT) as tar:
                    for name in members:
                        path = self.staging_dir / name
                        info = tarfile.TarInfo(f"{top}/{name}")
                        info.size = path.stat().st_size
                        info.mtime = mtime
                        info.mode = 0o644
                        info.uid = info.gid = 0
                        info.uname = info.gname = ""
                        with open(path, "rb") as fp:
                            tar.addfile(info, fp)
                if gzf is not None:
                    gzf.close()
                raw.flush()
                os.fsync(raw.fileno())
            os.replace(partial, out)
        except OSError as exc:
            with contextlib.suppress(OSError):
                partial.unlink()
            raise BundleError(f"cannot write bundle {_show(str(out))}: {exc}") from None
        with contextlib.suppress(OSError):
            fd = os.open(out.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _seal_self_sha256(data: bytes) -> bytes:
    """Fill in ``self_sha256``: the sha256 of the bytes with the zero placeholder in place."""
    digest = hashlib.sha256(data).hexdigest()
    zero = f'"self_sha256": "{_ZERO_SHA}"'.encode()
    if data.count(zero) != 1:
        raise BundleError("cannot finalize: manifest self_sha256 placeholder not found once")
    return data.replace(zero, f'"self_sha256": "{digest}"'.encode())


def _check_self_sha256(data: bytes) -> Problem | None:
    """A problem if manifest.json's ``self_sha256`` does not match its bytes (if present)."""
    found = list(SELF_SHA256_RE.finditer(data))
    if not found:
        return None  # optional: hand-made bundles may not carry it
    if len(found) > 1:
        return Problem("json-duplicate-key", "has more than one self_sha256", member=MANIFEST)
    m = found[0]
    recorded = m.group(1).decode()
    blanked = data[: m.start(1)] + _ZERO_SHA.encode() + data[m.end(1) :]
    actual = hashlib.sha256(blanked).hexdigest()
    if actual == recorded:
        return None
    return Problem(
        "sha256-mismatch",
        "content does not match its own self_sha256 (corrupt or altered)",
        member=MANIFEST,
        json_path="$.self_sha256",
        expected=recorded,
        actual=actual,
    )


def _member_sort_key(name: str) -> tuple[int, str]:
    """Small members first and the big log last: reading a member of a .tar.gz means
    decompressing everything stored before it."""
    order = {"fingerprint.json": 0, "launch.json": 1, "notes.json": 2, "analysis.json": 3}
    if name in order:
        return (order[name], name)
    if name == LOG_MEMBER:
        return (9, name)
    folder = name.split("/", 1)[0]
    return ({"requests": 4, "metrics": 5, "probes": 6, "logs": 7}.get(folder, 8), name)


def _hash_file(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fp:
        while chunk := fp.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _stub_fingerprint(why: str) -> dict[str, Any]:
    return {
        "schema": _schema.SCHEMA_IDS["fingerprint"],
        "collected_at": None,
        "host": {},
        "gpus": {"source": "error", "error": f"not collected: {why}", "devices": []},
        "container": {},
        "python": {},
        "env": {},
        "libraries": [],
        "probes": [],
    }


def _stub_launch(created: datetime, why: str) -> dict[str, Any]:
    return {
        "schema": _schema.SCHEMA_IDS["launch"],
        "argv": [],
        "cwd": None,
        "started_at": _iso(created),
        "ended_at": None,
        "exit_code": None,
        "signal": None,
        "exit_status": None,
        "ready_seconds": None,
        "stages_reached": [],
        "interrupted_by": None,
        "note": f"not collected: {why}",
    }


_PLACEHOLDER_RE = re.compile(rb"<redacted:([A-Za-z0-9_.-]+)#([0-9]+)(?::[0-9a-f]{8,16})?>")


def _merge_found_placeholders(
    records: list[dict[str, Any]], root: Path, members: list[str]
) -> list[dict[str, Any]]:
    """Seal: list placeholders present in text members but missing from the saved records."""
    known = {str(r.get("placeholder")) for r in records}
    found: dict[str, dict[str, Any]] = {}
    for name in members:
        if not (name.startswith(("logs/", "requests/")) or name.endswith(".json")):
            continue
        tail = b""
        with open(root / name, "rb") as fp:
            while chunk := fp.read(CHUNK):
                buf = tail + chunk
                for m in _PLACEHOLDER_RE.finditer(buf):
                    ph = m.group(0).decode("ascii")
                    if ph in known:
                        continue
                    rec = found.setdefault(
                        ph, {"placeholder": ph, "kind": m.group(1).decode("ascii"), "where": []}
                    )
                    if name not in rec["where"]:
                        rec["where"].append(name)
                tail = buf[-64:]
    return records + [found[k] for k in sorted(found)]


#: how far past a tail's offset seal looks for the line that completed it
PARTIAL_TAIL_WINDOW = 64 * 1024 * 1024


def seal(
    staging_dir: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    remove_staging: bool = False,
) -> Path:
    """Turn the staging folder of a capture that died into a valid bundle at ``out_path``.

    Missing ``launch.json`` / ``fingerprint.json`` / log get minimal valid stubs recorded in
    ``not_collected``; a truncated last log line is kept as is; a partial last row of
    ``logs/lines.tsv`` is dropped; invalid JSON members are kept under ``probes/unsealed-…``;
    the manifest says ``sealed_from_staging: true``. Raises BundleError if the folder is not a
    staging folder. The staging folder is kept unless ``remove_staging``.
    """
    staging = Path(staging_dir)
    if not staging.exists():
        raise BundleError(f"no such staging folder: {_show(str(staging))}")
    if not staging.is_dir():
        raise BundleError(f"{_show(str(staging))} is not a folder (seal takes a staging folder)")
    _append_partial_tails(staging / LOG_MEMBER)
    writer = BundleWriter.resume(staging)
    lines = staging / LINES_MEMBER
    if lines.is_file() and not lines.is_symlink():
        _drop_partial_last_row(lines)
    return writer.finalize(out_path, remove_staging=remove_staging, _sealed=True)


def _append_partial_tails(log: Path) -> None:
    """Append the unfinished last lines a killed capture kept beside the log, then remove
    those files.

    A tail file (``combined.log.partial-<stream>``, already redacted) holds the log's size when
    it was saved, a newline, then the bytes. The shim may have died after writing the completed
    line to the log but before removing the tail: then a line starting with those bytes stands
    in the log at or after that offset, and the stale tail is dropped instead of duplicated.
    """
    if not log.parent.is_dir():
        return
    for tail in sorted(log.parent.glob(log.name + ".partial-*")):
        if tail.is_file() and not tail.is_symlink() and not tail.name.endswith(".tmp"):
            raw = tail.read_bytes()
            head, _, data = raw.partition(b"\n")
            if data and head.isdigit() and not _completed_in_log(log, int(head), data):
                with open(log, "ab") as out:
                    out.write(data)
        tail.unlink()


def _completed_in_log(log: Path, offset: int, data: bytes) -> bool:
    if not log.is_file():
        return False
    with open(log, "rb") as fp:
        fp.seek(offset)
        # The completing line is among the first lines written after the tail was saved.
        after = fp.read(PARTIAL_TAIL_WINDOW)
    return after.startswith(data) or (b"\n" + data) in after


def _drop_partial_last_row(path: Path) -> None:
    size = path.stat().st_size
    if size == 0:
        return
    with open(path, "rb+") as fp:
        pos = size
        while pos > 0:
            step = min(CHUNK, pos)
            fp.seek(pos - step)
            block = fp.read(step)
            nl = block.rfind(b"\n")
            if nl >= 0:
                cut = pos - step + nl + 1
                if cut != size:
                    fp.truncate(cut)
                return
            pos -= step
        fp.truncate(0)
