"""Bounded, read-only access to tar / tar.gz archives from untrusted sources.

Nothing here writes to disk or follows links. Every byte that comes out of the (decompressed)
stream passes through :class:`_Guard`, which counts it: the total and the compression ratio are
bounded, a single read is bounded (so a hostile pax/GNU long-name header cannot make ``tarfile``
allocate gigabytes), and any decompression or I/O error becomes an :class:`ArchiveError` with a
stable code and a one-line message.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import stat
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "CHUNK",
    "MAX_BUNDLE_ENV",
    "ArchiveError",
    "Limits",
    "SafeTar",
    "lift_hint",
    "max_bundle_bytes",
    "sniff",
]

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
CHUNK = 1 * MiB
BLOCK = tarfile.BLOCKSIZE

#: the environment variable that sets the limit on a bundle's expanded size, in GiB
MAX_BUNDLE_ENV = "KK3_MAX_BUNDLE_GIB"
#: default expanded size of a whole bundle: what report/diff/compare on this 2-core machine
#: open in well under a minute (bench/bounds_bench.py); a bigger bundle is refused at its header
DEFAULT_MAX_BUNDLE_BYTES = 4 * GiB


def max_bundle_bytes() -> int:
    """The expanded-size limit: ``KK3_MAX_BUNDLE_GIB`` when it is a positive number, else 4 GiB."""
    raw = os.environ.get(MAX_BUNDLE_ENV, "").strip()
    try:
        gib = float(raw) if raw else 0.0
    except ValueError:
        gib = 0.0
    if not math.isfinite(gib) or gib <= 0 or gib > 2**20:
        return DEFAULT_MAX_BUNDLE_BYTES  # unset or not a sane number: the default holds
    return max(1, int(gib * GiB))


def lift_hint() -> str:
    """How to open a bigger bundle that you trust (ends every size refusal)."""
    return f"if you trust it, set {MAX_BUNDLE_ENV} to a larger number of GiB"


@dataclass(frozen=True, slots=True)
class Limits:
    """What a bundle from someone else may contain. Every limit is checked before memory grows.

    Logs may be several GB, so one member may be large; what is bounded is the whole archive's
    uncompressed total and its compression ratio (a gzip bomb stops as soon as the decompressed
    bytes pass ``max_compression_ratio`` times the compressed bytes read so far, once more than
    ``ratio_grace_bytes`` came out). Deflate tops out near 1030:1 (runs of one byte, the usual
    bomb); the most repetitive real logs measured (one warning repeated with a changing
    timestamp, tqdm redraws) compress 270-300:1, hence 600.
    """

    max_members: int = 10_000
    max_member_bytes: int = field(default_factory=max_bundle_bytes)  # logs/, probes/
    max_json_bytes: int = 16 * MiB  # every *.json member (read into memory)
    max_text_bytes: int = 32 * MiB  # metrics/*.prom (read into memory on demand; real ~1 MiB)
    max_total_bytes: int = field(default_factory=max_bundle_bytes)  # uncompressed members
    max_compression_ratio: float = 600.0
    ratio_grace_bytes: int = 64 * MiB
    max_json_depth: int = 64
    max_json_nodes: int = 1_000_000  # values in one JSON member (schema checks cost per value)
    max_json_total_bytes: int = 128 * MiB  # all JSON members together (kept in memory)
    max_name_bytes: int = 512
    max_header_bytes: int = 1 * MiB  # a single pax / GNU long-name record
    max_trailing_bytes: int = 16 * MiB  # zero padding read after the end-of-archive marker
    max_line_bytes: int = 1 * MiB  # iter_log_lines cuts longer lines (as the analyzer does)


class ArchiveError(Exception):
    """The archive cannot be read further. ``code`` is a :class:`Problem` code."""

    def __init__(self, code: str, message: str, member: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.member = member


_MAGIC: list[tuple[bytes, str]] = [
    (b"PK\x03\x04", "a zip archive"),
    (b"PK\x05\x06", "an empty zip archive"),
    (b"BZh", "bzip2-compressed"),
    (b"\xfd7zXZ\x00", "xz-compressed"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-zip archive"),
    (b"Rar!", "a RAR archive"),
    (b"\x89PNG", "a PNG image"),
    (b"%PDF", "a PDF document"),
]


def sniff(head: bytes) -> str:
    """``"gzip"`` or ``"tar"`` for what we read; raises :class:`ArchiveError` otherwise."""
    if not head:
        raise ArchiveError("empty-file", "the file is empty (0 bytes); not a bundle")
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    for magic, what in _MAGIC:
        if head.startswith(magic):
            code = (
                "not-tar"
                if "archive" in what or "image" in what or "document" in what
                else ("unsupported-compression")
            )
            raise ArchiveError(
                code, f"the file is {what}, not a bundle (bundles are .tar or gzip .tar.gz)"
            )
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    if len(head) < BLOCK:
        raise ArchiveError(
            "not-tar", f"the file is {len(head)} bytes, too short for a tar archive; not a bundle"
        )
    return "tar"  # old-style tar without magic: let the header checksum decide


#: longest gzip member header accepted (kk3evidence writes 10 bytes; ``gzip`` reads the name
#: and comment fields one byte per call, so 50 MB of them take a minute)
GZIP_HEADER_MAX = 64 * KiB


def check_gzip_header(head: bytes) -> None:
    """Refuse a gzip header (extra field, file name, comment) longer than GZIP_HEADER_MAX."""
    too_long = ArchiveError(
        "header-too-large",
        f"the gzip header (file name, comment or extra field) is longer than "
        f"{GZIP_HEADER_MAX} bytes; not a bundle (kk3evidence writes none)",
    )
    if len(head) < 10:
        return  # the gzip reader reports the truncation
    flags = head[3]
    pos = 10
    if flags & 4:  # FEXTRA
        pos += 2 + int.from_bytes(head[pos : pos + 2], "little")
    for bit in (8, 16):  # FNAME, FCOMMENT: zero-terminated
        if flags & bit:
            end = head.find(b"\0", pos)
            if end < 0:
                raise too_long
            pos = end + 1
    if pos > GZIP_HEADER_MAX:
        raise too_long


class _Guard(io.RawIOBase):
    """The decompressed byte stream, counted and bounded. Seeks forward by reading."""

    def __init__(self, raw: BinaryIO, compression: str, limits: Limits) -> None:
        super().__init__()
        self._raw = raw
        self._gz = compression == "gzip"
        self._inner: BinaryIO = (
            gzip.GzipFile(fileobj=raw, mode="rb") if self._gz else raw  # type: ignore[assignment]
        )
        self._limits = limits
        self._pos = 0
        self._high = 0
        self._max_read = max(limits.max_header_bytes, CHUNK) + 64 * KiB
        self._max_stream = limits.max_total_bytes + limits.max_trailing_bytes + 256 * MiB

    # io protocol -------------------------------------------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(b))
        n = len(data)
        memoryview(b)[:n] = data
        return n

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            raise ArchiveError("corrupt-archive", "unbounded read requested (bug)")
        if size > self._max_read:
            raise ArchiveError(
                "header-too-large",
                f"a tar header record of {size} bytes at offset {self._pos} exceeds the "
                f"{self._limits.max_header_bytes}-byte limit",
            )
        data = self._read(size)
        self._advance(len(data))
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_CUR:
            offset += self._pos
        elif whence != os.SEEK_SET:
            raise ArchiveError("corrupt-archive", "seek from end requested (bug)")
        if offset < 0:
            raise ArchiveError("corrupt-archive", f"seek to negative offset {offset}")
        if not self._gz:
            try:
                self._raw.seek(offset)
            except OSError as exc:
                raise ArchiveError("unreadable", f"cannot read the file: {exc}") from None
            self._pos = offset
            return offset
        if offset < self._pos:
            # Rare (tarfile never does it in order): GzipFile rewinds and re-decompresses up to
            # a point we already counted, so the limits still hold.
            try:
                self._inner.seek(offset)
            except (EOFError, OSError, zlib.error) as exc:
                raise self._translate(exc) from None
            self._pos = offset
            return offset
        while self._pos < offset:
            data = self._read(min(CHUNK, offset - self._pos))
            if not data:
                break  # past the end: the next read returns b"" and the caller sees truncation
            self._advance(len(data))
        return self._pos

    # internals ---------------------------------------------------------------------------
    def _read(self, size: int) -> bytes:
        try:
            return self._inner.read(size)
        except (EOFError, OSError, zlib.error) as exc:
            raise self._translate(exc) from None

    def _translate(self, exc: BaseException) -> ArchiveError:
        if isinstance(exc, EOFError):
            return ArchiveError(
                "truncated",
                f"the gzip stream ends early (truncated at about offset {self._pos} uncompressed)",
            )
        if isinstance(exc, gzip.BadGzipFile | zlib.error):
            return ArchiveError(
                "corrupt-archive",
                f"gzip data is corrupt near uncompressed offset {self._pos} ({exc})",
            )
        return ArchiveError("unreadable", f"cannot read the file: {exc}")

    def _advance(self, n: int) -> None:
        self._pos += n
        if self._pos <= self._high:
            return
        self._high = self._pos
        if self._high > self._max_stream:
            raise ArchiveError(
                "archive-too-large",
                f"the archive expands past {self._max_stream} bytes (limit on the total size); "
                f"{lift_hint()}",
            )
        if self._gz and self._high > self._limits.ratio_grace_bytes:
            consumed = max(self._raw.tell(), 1)
            if self._high > self._limits.max_compression_ratio * consumed:
                raise ArchiveError(
                    "compression-bomb",
                    f"gzip data expands {self._high // consumed}x "
                    f"({self._high} bytes from {consumed}); limit "
                    f"{self._limits.max_compression_ratio:g}x (decompression bomb?)",
                )


class SafeTar:
    """Iterate over an archive's headers and read members, bounded by :class:`Limits`.

    Use as a context manager. :meth:`headers` yields ``tarfile.TarInfo`` objects as parsed
    (names untrusted); :meth:`read_data` streams one member's data in chunks, and
    :meth:`check_end` inspects what follows the last header.
    """

    def __init__(self, path: Path, limits: Limits) -> None:
        self.path = path
        self.limits = limits
        try:
            # O_NONBLOCK: a FIFO swapped in after the caller's checks must not block us.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise ArchiveError("unreadable", f"cannot open the file: {exc.strerror}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ArchiveError("not-a-file", "not a regular file")
        self._raw: BinaryIO = os.fdopen(fd, "rb")
        try:
            head = self._raw.read(BLOCK)
            self.compression = sniff(head)
            if self.compression == "gzip":
                self._raw.seek(0)
                check_gzip_header(self._raw.read(GZIP_HEADER_MAX + 1))
                self._raw.seek(0)
                head = gzip.GzipFile(fileobj=self._raw, mode="rb").read(BLOCK)
                if not head:
                    raise ArchiveError("not-tar", "the file is an empty gzip stream; not a bundle")
                if sniff_inner(head) != "tar":  # pragma: no cover - sniff_inner raises
                    raise ArchiveError("not-tar", "not a tar archive")
            self._raw.seek(0)
        except ArchiveError:
            self._raw.close()
            raise
        except (EOFError, OSError, zlib.error) as exc:
            self._raw.close()
            code = "truncated" if isinstance(exc, EOFError) else "corrupt-archive"
            raise ArchiveError(code, f"gzip data is corrupt or truncated ({exc})") from None
        self._guard = _Guard(self._raw, self.compression, limits)
        self._tar: tarfile.TarFile | None = None

    def __enter__(self) -> SafeTar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._raw.close()

    def headers(self) -> Iterator[tarfile.TarInfo]:
        try:
            self._tar = tarfile.TarFile(
                fileobj=self._guard,
                mode="r",
                encoding="utf-8",
                errors="surrogateescape",
            )
        except tarfile.ReadError as exc:
            raise _translate_tar_error(exc, first=True) from None
        except (ValueError, OverflowError, UnicodeError) as exc:
            raise ArchiveError(
                "corrupt-archive", f"corrupt tar header at offset 0 ({exc})"
            ) from None
        tar = self._tar
        while True:
            try:
                info = tar.next()
            except tarfile.ReadError as exc:
                raise _translate_tar_error(exc, first=False) from None
            except (ValueError, OverflowError, UnicodeError) as exc:
                raise ArchiveError(
                    "corrupt-archive", f"corrupt tar header at offset {tar.offset} ({exc})"
                ) from None
            if info is None:
                return
            tar.members.clear()  # type: ignore[attr-defined]  # tarfile keeps every header
            yield info

    def seek(self, offset: int) -> None:
        """Move to uncompressed ``offset`` (forward seeks on gzip decompress, counted)."""
        self._guard.seek(offset)

    def read(self, size: int) -> bytes:
        """Read at most ``size`` (<= 1 MiB) uncompressed bytes."""
        return self._guard.read(size)

    def read_data(self, offset: int, size: int) -> Iterator[bytes]:
        """Yield the ``size`` bytes at uncompressed ``offset`` in chunks; truncation raises."""
        self._guard.seek(offset)
        left = size
        while left > 0:
            data = self._guard.read(min(CHUNK, left))
            if not data:
                raise ArchiveError(
                    "truncated",
                    f"the archive ends {left} bytes before the end of this member (truncated)",
                )
            left -= len(data)
            yield data

    def check_end(self) -> None:
        """After the last header: require an end-of-archive marker and only zeros after it."""
        if self._tar is None:
            return
        start = self._tar.offset
        self._guard.seek(start)
        block = self._guard.read(BLOCK)
        if not block:
            raise ArchiveError(
                "truncated",
                f"the archive ends at offset {start} without an end-of-archive marker (truncated?)",
            )
        if len(block) < BLOCK:
            raise ArchiveError(
                "truncated", f"the archive ends inside a tar header at offset {start} (truncated)"
            )
        if block.count(0) != BLOCK:
            # Name the member whose header this seems to be, if its name field is readable.
            name = block[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
            looks_like_header = block[257:262] == b"ustar"
            printable = looks_like_header and name.isprintable() and name
            raise ArchiveError(
                "corrupt-archive",
                f"invalid tar header at offset {start} (corrupt archive, or data after the end)",
                member=name if printable else None,
            )
        seen = 0
        pos = start + BLOCK
        while True:
            data = self._guard.read(CHUNK)
            if not data:
                return
            stripped = data.strip(b"\0")
            if stripped:
                at = pos + data.index(stripped[:1])
                raise ArchiveError(
                    "trailing-data", f"unexpected data after the end of the archive at offset {at}"
                )
            seen += len(data)
            pos += len(data)
            if seen > self.limits.max_trailing_bytes:
                raise ArchiveError(
                    "trailing-data",
                    f"more than {self.limits.max_trailing_bytes} bytes of padding after the end "
                    "of the archive",
                )


def sniff_inner(head: bytes) -> str:
    """What a gzip stream contains: only a tar is acceptable."""
    if head.startswith(b"\x1f\x8b"):
        raise ArchiveError("not-tar", "the gzip stream holds another gzip stream, not a tar")
    for magic, what in _MAGIC:
        if head.startswith(magic):
            raise ArchiveError("not-tar", f"the gzip stream holds {what}, not a tar archive")
    if len(head) < BLOCK:
        raise ArchiveError("not-tar", "the gzip stream is too short to hold a tar archive")
    return "tar"


def _translate_tar_error(exc: tarfile.ReadError, *, first: bool) -> ArchiveError:
    text = str(exc)
    if "unexpected end of data" in text or "truncated" in text:
        return ArchiveError("truncated", f"the archive is truncated ({text})")
    if first:
        return ArchiveError("not-tar", f"not a tar archive ({text})")
    return ArchiveError("corrupt-archive", f"corrupt tar archive ({text})")
