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
import enum
import errno
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import uuid
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, BinaryIO

from kk3evidence._version import __version__
from kk3evidence.bundle import schema as _schema
from kk3evidence.bundle.tarsafe import CHUNK, ArchiveError, Limits, SafeTar, lift_hint
from kk3evidence.errors import BundleError
from kk3evidence.model import FORMAT_IDS, JSONObject, JSONValue, Problem

if TYPE_CHECKING:
    from kk3evidence.bundle.redact import Redactor

__all__ = [
    "BUNDLE_SCHEMA",
    "BUNDLE_SUFFIXES",
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

BUNDLE_SCHEMA = FORMAT_IDS["bundle"]
#: file names a bundle may have (a plain or gzip-compressed tar)
BUNDLE_SUFFIXES = (".tar", ".tar.gz", ".tgz")
STAGING_SCHEMA = FORMAT_IDS["staging"]
STAGING_MARKER = "staging.json"
MANIFEST = "manifest.json"
# manifest.json cannot list itself: its "self_sha256" is the sha256 of its own bytes with that
# value replaced by 64 zeros, so any changed byte of the manifest is detected and named.
SELF_SHA256_RE = re.compile(rb'"self_sha256"\s*:\s*"([0-9a-f]{64})"')
_ZERO_SHA = "0" * 64
LOG_MEMBER = "logs/combined.log"
LINES_MEMBER = "logs/lines.tsv"
REQUIRED_MEMBERS: tuple[str, ...] = ("fingerprint.json", "launch.json", LOG_MEMBER)
OPTIONAL_MEMBERS: tuple[str, ...] = ("notes.json", "analysis.json", "preflight.json")
EXTRA_FOLDERS: tuple[str, ...] = ("logs", "requests", "metrics", "probes", "stalls")

_MEMBER_RE = re.compile(
    r"^(?:(?:manifest|fingerprint|launch|notes|analysis|preflight)\.json"
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


class _Next(enum.Enum):
    """What the archive pass does after a check: the member's next check (``GO``), the next
    member (``SKIP``), or nothing more (``STOP``: the rest of the archive cannot be trusted)."""

    GO = "go"
    SKIP = "skip"
    STOP = "stop"


#: one check of a scan, in the style of ``jsonschema``'s ``iter_errors``: it yields located
#: problems and returns what the scanner does next (``verdict = yield from check(...)``)
_Check = Generator[Problem, None, _Next]


#: manifest.json's entries by name: (size, sha256), each ``None`` where the entry lacks it
_Listed = dict[str, tuple[int | None, str | None]]


@dataclass(slots=True)
class _PassState:
    """What the archive pass has counted and seen so far, across members."""

    count: int = 0
    total: int = 0
    json_total: int = 0
    cached: int = 0
    tops: list[str] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    folded_names: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Member:
    """A tar header whose name passed the name check."""

    info: tarfile.TarInfo
    shown: str  # the raw name, safe to print
    parts: tuple[str, ...]  # the name's components, the top folder first
    top: str
    rest: str  # the name relative to the top folder ("" for the top folder itself)
    key: str  # the whole normalised name

    @classmethod
    def of(cls, info: tarfile.TarInfo, shown: str, parts: list[str]) -> _Member:
        return cls(info, shown, tuple(parts), parts[0], "/".join(parts[1:]), "/".join(parts))


def _special_kind(info: tarfile.TarInfo) -> str:
    """What a tar member that is neither a regular file nor a folder is, in words."""
    if info.ischr():
        return "character device"
    if info.isblk():
        return "block device"
    if info.isfifo():
        return "FIFO"
    if info.issparse():
        return "sparse file"
    return f"member of tar type {info.type.decode('latin-1')!r}"


class _Scanner:
    """One streaming pass over a bundle; yields problems and keeps what a Bundle needs.

    The pass is composed of one generator per check (:meth:`_scan_member` lists them in the
    order they run on each header); after the pass, :meth:`_check_manifest` composes the
    checks of the manifest against what was really there.
    """

    def __init__(self, path: str | os.PathLike[str], limits: Limits) -> None:
        self.path = Path(path)
        self.limits = limits
        self.top: str | None = None
        self.compression = "tar"
        self.seen: dict[str, _Seen] = {}
        self.manifest: JSONObject | None = None
        self.documents: dict[str, JSONValue] = {}
        self.file_id: _FileId | None = None
        self.manifest_corrupt = False

    def run(self) -> Iterator[Problem]:
        st = yield from self._check_file()
        if st is None:
            return
        self.file_id = _FileId.of(st)
        fatal = False
        try:
            with SafeTar(self.path, self.limits) as tar:
                self.compression = tar.compression
                for problem in self._scan_archive(tar):
                    fatal = fatal or problem.code in _FATAL
                    yield problem
        except ArchiveError as exc:
            yield Problem(exc.code, exc.message, member=exc.member)
            return
        if fatal:
            return
        yield from self._check_manifest()

    def _check_file(self) -> Generator[Problem, None, os.stat_result | None]:
        """The path names a non-empty regular file (else why not); returns its stat."""
        p = self.path
        try:
            st = p.stat()
        except FileNotFoundError:
            yield Problem("not-found", f"no such file: {_show(str(p))}")
            return None
        except OSError as exc:
            yield Problem("unreadable", f"cannot read {_show(str(p))}: {exc.strerror}")
            return None
        if p.is_dir():
            hint = (
                "; it looks like a capture's staging folder: run `kk3evidence seal` on it"
                if is_staging_dir(p)
                else ""
            )
            yield Problem("not-a-file", f"{_show(str(p))} is a directory, not a bundle{hint}")
            return None
        if not p.is_file():
            yield Problem("not-a-file", f"{_show(str(p))} is not a regular file")
            return None
        if st.st_size == 0:
            yield Problem("empty-file", "the file is empty (0 bytes); not a bundle")
            return None
        return st

    # The archive pass ------------------------------------------------------------------------
    def _scan_archive(self, tar: SafeTar) -> Iterator[Problem]:
        """The single streaming pass: every header through the member checks, then the end."""
        state = _PassState()
        for info in tar.headers():
            if (yield from self._scan_member(tar, info, state)) is _Next.STOP:
                return
        if state.tops:
            self.top = state.tops[0]
        if (yield from self._check_end(tar)) is _Next.STOP:
            return
        if state.count == 0:
            yield Problem("not-tar", "the archive has no members; not a bundle")

    def _scan_member(self, tar: SafeTar, info: tarfile.TarInfo, state: _PassState) -> _Check:
        """Every check of one header, in order: the first that does not say GO decides."""
        verdict = yield from self._check_count(state)
        if verdict is not _Next.GO:
            return verdict
        if info.isdir() and info.name.strip("/") in ("", "."):
            return _Next.SKIP  # the "./" entry `tar -C dir .` writes
        member = yield from self._check_name(info)
        if member is None:
            return _Next.SKIP
        checks = (
            self._check_type,
            self._check_unique,
            self._check_top_folder,
            self._check_member_name,
            self._check_size,
        )
        for check in checks:
            verdict = yield from check(member, state)
            if verdict is not _Next.GO:
                return verdict
        verdict = yield from self._read_member(tar, member, state)
        if verdict is not _Next.GO:
            return verdict
        return (yield from self._check_own_sha256(member))

    def _check_count(self, state: _PassState) -> _Check:
        """Counts the header; past ``max_members`` the pass stops."""
        state.count += 1
        limit = self.limits.max_members
        if state.count > limit:
            yield Problem(
                "too-many-members",
                f"the archive has more than {limit} members",
                expected=f"<= {limit}",
            )
            return _Next.STOP
        return _Next.GO

    def _check_name(self, info: tarfile.TarInfo) -> Generator[Problem, None, _Member | None]:
        """The raw name is safe (UTF-8, bounded, relative, no control characters, no '..')."""
        raw = info.name
        shown = _show(raw)
        try:
            encoded = raw.encode("utf-8")
        except UnicodeEncodeError:
            yield Problem("bad-name", "member name is not valid UTF-8", member=shown)
            return None
        if len(encoded) > self.limits.max_name_bytes:
            yield Problem(
                "bad-name",
                f"member name is {len(encoded)} bytes long (limit {self.limits.max_name_bytes})",
                member=shown[:80] + "…",
            )
            return None
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
            yield Problem("bad-name", "member name contains control characters", member=shown)
            return None
        if raw.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", raw):
            yield Problem(
                "absolute-path", "absolute path; bundle members must be relative", member=shown
            )
            return None
        if "\\" in raw:
            yield Problem("bad-name", "member name contains a backslash", member=shown)
            return None
        name = raw
        while name.startswith("./"):
            name = name[2:]
        if info.isdir():
            name = name.rstrip("/")
        parts = name.split("/")
        if ".." in parts:
            yield Problem(
                "path-traversal",
                "member name contains '..' and would escape the bundle folder",
                member=shown,
            )
            return None
        if not name or any(x in ("", ".") for x in parts):
            yield Problem("bad-name", "member name has an empty or '.' component", member=shown)
            return None
        if not _TOP_RE.match(parts[0]):
            yield Problem("bad-name", "the top folder name has unexpected characters", member=shown)
            return None
        return _Member.of(info, shown, parts)

    def _check_type(self, member: _Member, state: _PassState) -> _Check:
        """Types before data: nothing but regular files and folders."""
        info, shown = member.info, member.shown
        if info.issym() or info.islnk():
            kind = "symbolic" if info.issym() else "hard"
            yield Problem(
                "link",
                f"{kind} link to {_show(info.linkname)!r}; bundles may not contain links",
                member=shown,
            )
            return _Next.SKIP
        if info.size < 0:
            yield Problem(
                "corrupt-archive", f"declares a negative size ({info.size})", member=shown
            )
            return _Next.STOP
        if info.type == tarfile.GNUTYPE_SPARSE or info.sparse is not None:
            yield Problem(
                "special-file", "is a sparse file; bundles hold only regular files", member=shown
            )
            return _Next.SKIP
        if not (info.isreg() or info.isdir()):
            yield Problem(
                "special-file",
                f"is a {_special_kind(info)}; bundles hold only regular files",
                member=shown,
            )
            return _Next.SKIP
        return _Next.GO

    def _check_unique(self, member: _Member, state: _PassState) -> _Check:
        """No name twice, not even in another letter case."""
        key, shown = member.key, member.shown
        if key in state.names:
            yield Problem("duplicate-member", "appears more than once in the archive", member=shown)
            return _Next.SKIP
        state.names.add(key)
        folded = key.casefold()
        if folded in state.folded_names:
            yield Problem(
                "duplicate-member",
                f"differs only in letter case from {_show(state.folded_names[folded])!r} "
                "(they would collide on a case-insensitive file system)",
                member=shown,
            )
            return _Next.SKIP
        state.folded_names[folded] = key
        return _Next.GO

    def _check_top_folder(self, member: _Member, state: _PassState) -> _Check:
        """Every member inside one top folder (a second top folder is reported once)."""
        top, shown, tops = member.top, member.shown, state.tops
        if not member.rest and not member.info.isdir():
            yield Problem(
                "outside-top-folder", "is not inside the bundle's top folder", member=shown
            )
            return _Next.SKIP
        if top not in tops:
            tops.append(top)
            if len(tops) == 2:
                yield Problem(
                    "multiple-top-folders",
                    f"the archive has more than one top folder ({_show(tops[0])!r} and "
                    f"{_show(top)!r}); a bundle has exactly one",
                    member=shown,
                )
        return _Next.GO

    def _check_member_name(self, member: _Member, state: _PassState) -> _Check:
        """Folders and files are v1 bundle members (folders end the member's checks)."""
        parts, rest = member.parts, member.rest
        if member.info.isdir():
            if rest and not (
                parts[1] in EXTRA_FOLDERS and all(_TOP_RE.match(x) for x in parts[1:])
            ):
                yield Problem("unexpected-member", "is not a v1 bundle folder", member=member.shown)
            return _Next.SKIP
        if member.top != state.tops[0]:
            return _Next.SKIP  # already reported
        if not is_member_name(rest):
            yield Problem(
                "unexpected-member",
                "is not a v1 bundle member (allowed: manifest.json, fingerprint.json, "
                "launch.json, notes.json, analysis.json, preflight.json, logs/, "
                "requests/, metrics/, probes/, stalls/)",
                member=_show(rest),
            )
            return _Next.SKIP
        return _Next.GO

    def _check_size(self, member: _Member, state: _PassState) -> _Check:
        """The member's own limit, then the JSON and archive totals (past those, stop).

        The declared size counts towards the total even for a member that is skipped:
        skipping it in a ``.tar.gz`` means decompressing it, so a header declaring 40 GiB
        stops the pass at once instead of costing 40 GiB of inflation."""
        size, rest, lim = member.info.size, member.rest, self.limits
        limit = _member_limit(rest, lim)
        state.total += size
        over_total = state.total > lim.max_total_bytes
        if size > limit:
            hint = f"; {lift_hint()}" if limit == lim.max_member_bytes else ""
            yield Problem(
                "member-too-large",
                f"is {size} bytes, over the {limit}-byte limit for this member{hint}",
                member=rest,
                expected=f"<= {limit}",
                actual=str(size),
            )
            # Past the total too: the rest of the archive is not reached (one problem says it).
            return _Next.STOP if over_total else _Next.SKIP
        if over_total:
            yield Problem(
                "archive-too-large",
                f"members add up to more than {lim.max_total_bytes} bytes "
                f"({lim.max_total_bytes / 2**30:g} GiB, the limit on a bundle's expanded "
                f"size); {lift_hint()}",
                member=rest,
            )
            return _Next.STOP
        if rest.endswith(".json"):
            state.json_total += size
            if state.json_total > lim.max_json_total_bytes:
                yield Problem(
                    "archive-too-large",
                    f"JSON members add up to more than {lim.max_json_total_bytes} bytes",
                    member=rest,
                )
                return _Next.STOP
        return _Next.GO

    def _read_member(self, tar: SafeTar, member: _Member, state: _PassState) -> _Check:
        """Hash the member's data; a read error ends the pass."""
        info, rest = member.info, member.rest
        # JSON is parsed after the pass; small metrics are kept so metrics() need not
        # decompress the archive again.
        keep = rest.endswith(".json") or (
            rest.startswith("metrics/")
            and info.size <= _CACHE_MEMBER_BYTES
            and state.cached + info.size <= _CACHE_TOTAL_BYTES
        )
        if keep and not rest.endswith(".json"):
            state.cached += info.size
        digest = hashlib.sha256()
        chunks: list[bytes] = []
        try:
            for chunk in tar.read_data(info.offset_data, info.size):
                digest.update(chunk)
                if keep:
                    chunks.append(chunk)
        except ArchiveError as exc:
            yield Problem(exc.code, exc.message, member=rest)
            return _Next.STOP
        data = b"".join(chunks) if keep else None
        self.seen[rest] = _Seen(info.size, digest.hexdigest(), info.offset_data, data)
        return _Next.GO

    def _check_own_sha256(self, member: _Member) -> _Check:
        """manifest.json matches its own ``self_sha256`` (else nothing in it is trusted)."""
        seen = self.seen[member.rest]
        if member.rest == MANIFEST and seen.data is not None:
            problem = _check_self_sha256(seen.data)
            if problem is not None:
                self.manifest_corrupt = True
                yield problem
        return _Next.GO

    def _check_end(self, tar: SafeTar) -> _Check:
        """The archive ends where a tar ends (no truncation, nothing hidden after it)."""
        try:
            tar.check_end()
        except ArchiveError as exc:
            member = exc.member
            if member is not None and self.top and member.startswith(self.top + "/"):
                member = member[len(self.top) + 1 :]
            yield Problem(exc.code, exc.message, member=member)
            return _Next.STOP
        return _Next.GO

    # Manifest and documents ------------------------------------------------------------------
    def _check_manifest(self) -> Iterator[Problem]:
        """The manifest against what was really there; then only verified JSON is parsed."""
        manifest = yield from self._parse_manifest()
        if manifest is None:
            return
        self.manifest = manifest
        listed = yield from self._check_listing(manifest)
        verified = yield from self._check_members(listed)
        yield from self._check_missing(listed)
        yield from self._check_documents(verified)
        for name, got in self.seen.items():
            if name.endswith(".json"):
                got.data = None  # parsed documents are kept; raw JSON bytes are not

    def _parse_manifest(self) -> Generator[Problem, None, JSONObject | None]:
        """manifest.json is there, parses, is v1, is not too long and matches its schema;
        returns it (``None``: nothing more can be checked)."""
        lim = self.limits
        if MANIFEST not in self.seen:
            yield Problem(
                "missing-manifest",
                "the bundle has no manifest.json in its top folder; not a kk3evidence bundle",
                member=MANIFEST,
            )
            return None
        if self.manifest_corrupt:
            return None  # already reported; nothing in it can be trusted
        manifest, problems = _schema.parse_json(
            self.seen[MANIFEST].data or b"",
            MANIFEST,
            max_depth=lim.max_json_depth,
            max_nodes=lim.max_json_nodes,
        )
        if problems:
            yield from problems
            return None
        vp = _schema.version_problem(manifest, "manifest", MANIFEST)
        if vp is not None:
            yield vp
            return None
        entries = manifest.get("members") if isinstance(manifest, dict) else None
        if isinstance(entries, list) and len(entries) > lim.max_members:
            yield Problem(
                "too-many-members",
                f"manifest.json lists {len(entries)} members (limit {lim.max_members})",
                member=MANIFEST,
                json_path="$.members",
                expected=f"<= {lim.max_members}",
                actual=str(len(entries)),
            )
            return None
        yield from _schema.iter_schema_problems("manifest", manifest, MANIFEST)
        return manifest if isinstance(manifest, dict) else None

    def _check_listing(self, manifest: JSONObject) -> Generator[Problem, None, _Listed]:
        """Each member listed once, manifest.json not at all; returns name -> (size, sha256)
        as far as the entry states them."""
        listed: _Listed = {}
        entries = manifest.get("members")
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                continue
            name = str(entry["name"])
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
        return listed

    def _check_members(self, listed: _Listed) -> Generator[Problem, None, set[str]]:
        """Every member in the archive is listed with its size and sha256; returns the names
        verified on both."""
        verified: set[str] = set()
        for name, got in self.seen.items():
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
        return verified

    def _check_missing(self, listed: _Listed) -> Iterator[Problem]:
        """Every listed member, and every required one, is in the archive."""
        for name in listed:
            if name != MANIFEST and name not in self.seen:
                yield Problem(
                    "missing-member",
                    "is listed in manifest.json but not in the archive",
                    member=_show(name),
                )
        for name in REQUIRED_MEMBERS:
            if name not in self.seen and name not in listed:
                yield Problem("missing-member", "required member is missing", member=name)

    def _check_documents(self, verified: set[str]) -> Iterator[Problem]:
        """Only verified JSON is parsed and trusted: parse, version, schema; keeps the
        documents that parse and carry a version this reader knows."""
        lim = self.limits
        for name in sorted(verified):
            stem = _schema.schema_for_member(name)
            if stem is None:
                continue
            doc, problems = _schema.parse_json(
                self.seen[name].data or b"",
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


def _object(doc: JSONValue) -> JSONObject | None:
    """A verified member's document: an object (its schema says so), else ``None``."""
    return doc if isinstance(doc, dict) else None


def _objects(value: JSONValue) -> list[JSONObject]:
    """A verified array of objects (its schema says so), as a new list."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


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
        self.manifest: JSONObject = scan.manifest
        docs = scan.documents
        self.fingerprint: JSONObject | None = _object(docs.get("fingerprint.json"))
        self.launch: JSONObject | None = _object(docs.get("launch.json"))
        self.notes: JSONObject | None = _object(docs.get("notes.json"))
        self.analysis: JSONObject | None = _object(docs.get("analysis.json"))
        self.preflight: JSONObject | None = _object(docs.get("preflight.json"))
        self._documents: dict[str, JSONValue] = docs
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
    def redactions(self) -> list[JSONObject]:
        return _objects(self.manifest.get("redactions", []))

    @property
    def not_collected(self) -> list[JSONObject]:
        return _objects(self.manifest.get("not_collected", []))

    @property
    def group(self) -> JSONObject | None:
        """``manifest.json["group"]`` (SPEC §3, 0.2) or None for a single-node bundle."""
        g = self.manifest.get("group")
        return g if isinstance(g, dict) else None

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

    def json(self, name: str) -> JSONValue:
        """A verified JSON member (``None`` if absent)."""
        return self._documents.get(name)

    def requests(self) -> list[JSONObject]:
        """Every ``requests/*.json`` record, ordered by member name."""
        return _objects(
            [
                self._documents[n]
                for n in sorted(self._documents)
                if n.startswith("requests/") and n.endswith(".json")
            ]
        )

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
        ``limits.max_line_bytes`` is cut: its head comes out (with a ``\\n``) and the rest up
        to its newline is skipped, so memory stays bounded and line numbers stay the file's (as
        the analyzer counts them). Streams; the sha256 is checked when the end is reached.
        """
        if name not in self._members:
            return
        max_line = self.limits.max_line_bytes
        with self.open_member(name) as fp:
            # BufferedReader.readline splits on b"\n" only, in C; the limit caps huge lines.
            while line := fp.readline(max_line):
                if len(line) == max_line and not line.endswith(b"\n"):
                    while (rest := fp.readline(max_line)) and not rest.endswith(b"\n"):
                        pass  # the rest of a huge line, skipped in bounded pieces
                    line += b"\n" if rest else b""
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
            "launch.json, notes.json, analysis.json, preflight.json, logs/…, requests/…, "
            "metrics/…, probes/…, stalls/…)"
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


def _dumps(obj: object) -> bytes:
    try:
        text = json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise BundleError(f"cannot write JSON: {exc}") from None
    try:
        return (text + "\n").encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (a non-UTF-8 argv word or path, decoded with surrogateescape):
        # written as a \\udcXX escape, which is valid JSON that reads back the same.
        return (json.dumps(obj, indent=2, ensure_ascii=True, allow_nan=False) + "\n").encode()


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
        # Members held in memory instead of the staging folder: when sealing on a full disk,
        # stubs and the manifest go straight into the tar written elsewhere.
        self._overlay: dict[str, bytes] = {}
        self._sealing = False
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
                group = state.get("group")
                self._group: dict[str, Any] | None = group if isinstance(group, dict) else None
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
        self._group = None
        try:
            self.staging_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BundleError(
                f"cannot create staging folder {_show(str(self.staging_dir))}: {exc.strerror}"
            ) from None
        self._save_state()

    @classmethod
    def resume(
        cls,
        staging_dir: str | os.PathLike[str],
        *,
        bundle_id: str | None = None,
        created: datetime | None = None,
        redactor: Redactor | None = None,
        tool_version: str = __version__,
    ) -> BundleWriter:
        """Reopen an existing staging folder (it must carry a ``staging.json`` marker)."""
        if not is_staging_dir(staging_dir):
            raise BundleError(
                f"{_show(str(staging_dir))} is not a kk3evidence staging folder "
                "(no valid staging.json)"
            )
        return cls(
            staging_dir,
            bundle_id=bundle_id,
            created=created,
            redactor=redactor,
            tool_version=tool_version,
        )

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
            **({"group": self._group} if self._group is not None else {}),
        }

    def _save_state(self) -> None:
        try:
            _atomic_write(self.staging_dir / STAGING_MARKER, _dumps(self._state()))
        except OSError:
            if not self._sealing:
                raise  # sealing: the state is in memory and goes into the manifest

    def _put(self, name: str, data: bytes) -> None:
        """Write a member into the staging folder; when sealing on a full disk, hold it in
        memory for the tar instead."""
        try:
            _atomic_write(self.staging_dir / name, data)
        except OSError:
            if not self._sealing:
                raise
            self._overlay[name] = data

    def checkpoint(self) -> None:
        """Save redaction records etc. into ``staging.json`` (done by every write_json)."""
        self._save_state()

    def path_of(self, member: str) -> Path:
        """Where ``member`` lives in the staging folder."""
        return self.staging_dir / _check_writer_name(member)

    # members ---------------------------------------------------------------------------
    def write_json(self, member: str, obj: object, *, validate: bool = True) -> None:
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

    def set_group(self, group: Mapping[str, object] | None) -> None:
        """Name the multi-node group this bundle belongs to (SPEC §3, 0.2; saved immediately,
        written into ``manifest.json["group"]`` at :meth:`finalize`)."""
        self._group = dict(group) if group is not None else None
        self._save_state()

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
            self._put("fingerprint.json", _dumps(_stub_fingerprint(why)))
            self.add_not_collected("fingerprint.json", why)
        if "launch.json" not in present:
            self._put("launch.json", _dumps(_stub_launch(self.created, why)))
            self.add_not_collected("launch.json", why)
        if LOG_MEMBER not in present:
            self._put(LOG_MEMBER, b"")
            self.add_not_collected(LOG_MEMBER, f"no output was captured ({why})")

    def _check_json_members(self, members: list[str], *, lenient: bool) -> list[str]:
        kept: list[str] = []
        for name in members:
            stem = _schema.schema_for_member(name)
            if stem is None:
                kept.append(name)
                continue
            path = self.staging_dir / name
            data = self._overlay.get(name)
            if data is None:
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
        redactions: Iterable[Mapping[str, object]] | None = None,
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
        self._sealing = _sealed
        present = set(self._walk(lenient=_sealed))
        self._stub_missing(present, sealed=_sealed)
        members = self._walk(lenient=_sealed) + list(self._overlay)
        members = self._check_json_members(members, lenient=_sealed)
        members = sorted(set(members), key=_member_sort_key)
        entries = []
        for name in members:
            held = self._overlay.get(name)
            size, sha = (
                (len(held), hashlib.sha256(held).hexdigest())
                if held is not None
                else _hash_file(self.staging_dir / name)
            )
            entries.append({"name": name, "size": size, "sha256": sha})
        red: list[Mapping[str, object]]
        if redactions is not None:
            red = [dict(r) for r in redactions]
        elif self.redactor is not None:
            red = list(self.redactor.records())
        else:
            red = list(self._redactions)
        if _sealed:
            red = _merge_found_placeholders(red, self.staging_dir, members, self._overlay)
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
        if self._group is not None:
            manifest["group"] = self._group
        problems = list(_schema.iter_schema_problems("manifest", manifest, MANIFEST))
        if problems:
            raise BundleError(f"cannot finalize: {problems[0]}", list(problems))
        manifest_bytes = _seal_self_sha256(_dumps(manifest))
        self._put(MANIFEST, manifest_bytes)
        self._write_tar(out, [MANIFEST, *members])
        if remove_staging:
            shutil.rmtree(self.staging_dir, ignore_errors=True)
        return out

    def _write_tar(self, out: Path, members: list[str]) -> None:
        top = f"kk3-{self.bundle_id}"
        mtime = int(self.created.timestamp())
        gz = out.name.endswith((".tar.gz", ".tgz"))
        # Our own temporary name: two writers of one bundle path never share it.
        partial = out.with_name(f"{out.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        if out.exists() or out.is_symlink():
            raise BundleError(
                f"{_show(str(out))} already exists; a bundle is never overwritten: "
                "choose another output path or move that file away"
            )
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
                        held = self._overlay.get(name)
                        info = tarfile.TarInfo(f"{top}/{name}")
                        info.size = len(held) if held is not None else path.stat().st_size
                        info.mtime = mtime
                        info.mode = 0o644
                        info.uid = info.gid = 0
                        info.uname = info.gname = ""
                        if held is not None:
                            tar.addfile(info, io.BytesIO(held))
                            continue
                        with open(path, "rb") as fp:
                            tar.addfile(info, fp)
                if gzf is not None:
                    gzf.close()
                raw.flush()
                os.fsync(raw.fileno())
            _rename_no_replace(partial, out)
        except FileExistsError:
            with contextlib.suppress(OSError):
                partial.unlink()
            raise BundleError(
                f"{_show(str(out))} appeared while the bundle was written; it is not "
                "overwritten: choose another output path"
            ) from None
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


def _rename_no_replace(src: Path, dst: Path) -> None:
    """Atomic rename that fails with FileExistsError if ``dst`` exists (SPEC §3: a bundle is
    never overwritten): a hard link then unlink; where links are not supported, a check then
    a rename (a narrow race, on such file systems only)."""
    try:
        os.link(src, dst)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        if dst.exists() or dst.is_symlink():
            raise FileExistsError(errno.EEXIST, "exists", str(dst)) from None
        os.rename(src, dst)
        return
    os.unlink(src)


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


def _member_chunks(root: Path, name: str, held: Mapping[str, bytes]) -> Iterator[bytes]:
    """The bytes of a member: held in memory (a stub sealing could not write on a full disk)
    or read from the staging folder in chunks."""
    if name in held:
        yield held[name]
        return
    with open(root / name, "rb") as fp:
        while chunk := fp.read(CHUNK):
            yield chunk


def _merge_found_placeholders(
    records: list[Mapping[str, object]],
    root: Path,
    members: list[str],
    held: Mapping[str, bytes],
) -> list[Mapping[str, object]]:
    """Seal: list placeholders present in text members but missing from the saved records."""
    known = {str(r.get("placeholder")) for r in records}
    found: dict[str, dict[str, Any]] = {}
    for name in members:
        if not (name.startswith(("logs/", "requests/")) or name.endswith(".json")):
            continue
        tail = b""
        for chunk in _member_chunks(root, name, held):
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
    try:
        unappended = _append_partial_tails(staging / LOG_MEMBER)
        writer = BundleWriter.resume(staging)
        writer._sealing = True
        if unappended:
            writer._losses.append(
                {
                    "member": LOG_MEMBER,
                    "reason": "the unfinished last line could not be appended: no space left "
                    "(it is still in the staging folder; seal again once there is room)",
                    "bytes": unappended,
                    "lines": 1,
                    "at": _iso(_utcnow()),
                }
            )
        _apply_ledger(writer, staging)
        lines = staging / LINES_MEMBER
        if lines.is_file() and not lines.is_symlink():
            _drop_partial_last_row(lines)
        return writer.finalize(out_path, remove_staging=remove_staging, _sealed=True)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise BundleError(_no_space(staging, Path(out_path))) from None
        raise BundleError(
            f"cannot seal {_show(str(staging))}: {exc.strerror or exc}; nothing was removed"
        ) from None
    except BundleError as exc:
        if "No space left" in exc.message or "Disk quota" in exc.message:
            raise BundleError(_no_space(staging, Path(out_path))) from None
        raise


def _no_space(staging: Path, out: Path) -> str:
    need = 0
    for dirpath, _dirs, files in os.walk(staging, followlinks=False):
        for fn in files:
            with contextlib.suppress(OSError):
                need += os.lstat(os.path.join(dirpath, fn)).st_size
    mib = need // (1024 * 1024) + 2
    return (
        f"no space left on the device: sealing needs about {mib} MiB free where the bundle "
        f"{_show(str(out))} is written (the size of the staging folder, plus a little in the "
        f"staging folder itself); free that much (see 'df {_show(str(out.parent or '.'))}') "
        f"or write elsewhere with -o; nothing was lost: {_show(str(staging))} is kept as it was"
    )


def _apply_ledger(writer: BundleWriter, staging: Path) -> None:
    """What the capture's ledger says was lost (bundle/ledger.py), into the manifest: losses
    it recorded but never saved (a full disk), and what it had received but not yet written
    when it was killed. A start-time launch.json is marked as such."""
    from kk3evidence.bundle.ledger import read_ledger

    doc = read_ledger(staging)
    have = {(loss.get("member"), loss.get("reason")) for loss in writer._losses}
    losses = (doc or {}).get("losses")
    for loss in losses if isinstance(losses, list) else []:  # anything else holds no dicts
        if isinstance(loss, dict) and (loss.get("member"), loss.get("reason")) not in have:
            writer._losses.append(loss)
    # No ledger document yet (killed before the writer's first batch) is no "final" either.
    if not (doc or {}).get("final") and _killed_loss_from_counters(writer, staging):
        pass
    elif doc is not None and not doc.get("final"):
        numbers = [doc.get(k) for k in ("received_bytes", "written_bytes", "dropped_bytes")]
        if all(isinstance(n, int) for n in numbers):
            received, written, dropped = (int(n) for n in numbers)  # type: ignore[arg-type]
            lost = received - written - dropped
            writer._losses.append(
                {
                    "member": LOG_MEMBER,
                    "reason": "capture was killed: output it had received (and passed through) "
                    "but not yet written; at least this much, more if it arrived after "
                    "the last ledger update",
                    "bytes": max(lost, 0),
                    "lines": None,
                    "at": _iso(_utcnow()),
                }
            )
    launch = staging / "launch.json"
    if launch.is_file() and not launch.is_symlink():
        with contextlib.suppress(OSError, ValueError):
            doc_l = json.loads(launch.read_bytes())
            if isinstance(doc_l, dict) and doc_l.get("ended_at") is None:
                writer._not_collected.append(
                    {
                        "what": "launch.json (end of run)",
                        "reason": "the capture stopped before the run ended: end time, exit "
                        "status, readiness and stages reached were never written; "
                        "launch.json is the copy written at start",
                    }
                )


def _killed_loss_from_counters(writer: BundleWriter, staging: Path) -> bool:
    """The exact loss of a killed capture from its counters (bundle/ledger.py): everything it
    received (counted before it was shown) that is neither in the log (tails appended) nor
    already recorded as lost. ``False`` when there are no counters (an older capture)."""
    from kk3evidence.bundle.ledger import read_counters

    counters = read_counters(staging)
    log = staging / LOG_MEMBER
    if counters is None or log.is_symlink() or not log.is_file():
        return False
    received, shrink = counters
    recorded = sum(
        int(loss.get("bytes") or 0)
        for loss in writer._losses
        if loss.get("member") == LOG_MEMBER and isinstance(loss.get("bytes"), int)
    )
    lost = received - log.stat().st_size - shrink - recorded
    writer._losses.append(
        {
            "member": LOG_MEMBER,
            "reason": "capture was killed: output it had received (and passed through, or "
            "was about to) but not yet written",
            "bytes": max(lost, 0),
            "lines": None,
            "at": _iso(_utcnow()),
        }
    )
    return True


def _append_partial_tails(log: Path) -> int:
    """Append the unfinished last lines a killed capture kept beside the log, then remove
    those files.

    A tail file (``combined.log.partial-<stream>``, already redacted) holds the log's size when
    it was saved, a newline, then the bytes. The shim may have died after writing the completed
    line to the log but before removing the tail: then a line starting with those bytes stands
    in the log at or after that offset, and the stale tail is dropped instead of duplicated.
    """
    lost = 0
    if log.parent.is_symlink() or not log.parent.is_dir() or log.is_symlink():
        return 0  # never write through a link out of the staging folder (it is left out anyway)
    for tail in sorted(log.parent.glob(log.name + ".partial-*")):
        if tail.is_file() and not tail.is_symlink() and not tail.name.endswith(".tmp"):
            raw = tail.read_bytes()
            head, _, data = raw.partition(b"\n")
            if data and head.isdigit() and not _completed_in_log(log, int(head), data):
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                fd = os.open(log, flags, 0o644)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                except OSError as exc:
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    lost += len(data)  # kept beside the log for a later seal
                    continue
                finally:
                    os.close(fd)
        tail.unlink()
    return lost


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
