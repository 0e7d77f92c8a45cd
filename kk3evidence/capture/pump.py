"""Live pass-through of a child's stdout/stderr, and the line log written beside it.

Two pieces, so that a single slow disk write never holds up the pass-through:

* :class:`Pump` (one thread) reads both pipes with ``os.read`` as soon as data is there, stamps
  each chunk with its receive time (wall and monotonic, ns), counts it as received (a shared
  file mapping that survives a SIGKILL, see bundle/ledger.py), writes it unchanged to our own
  stdout/stderr, and hands it to the recorder. It never writes to the disk itself; it waits
  only when the recorder's queue is full.
* :class:`LineRecorder` (one thread) receives chunks through a queue bounded in bytes, joins
  them into whole lines per stream (a partial line waits for its newline; more than
  ``MAX_PARTIAL`` bytes without one is written in pieces, never cutting a secret in two),
  optionally redacts them, and appends
  them to ``logs/combined.log`` with one ``lines.tsv`` row per line. When the queue is full, the
  pump waits for room before it reads on (backpressure, like ``tee``: CMD is slowed, nothing is
  dropped, memory stays bounded). Only a write that fails (full disk, I/O error) or a writer that
  makes no progress for ``STALL_SECONDS`` drops data, *from the log only*, counted in
  :attr:`LineRecorder.losses`; the pass-through goes on.

A line's receive time is the time the chunk holding its newline arrived.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import os
import selectors
import sys
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import accumulate, islice, repeat
from operator import add
from typing import BinaryIO, Protocol

#: a partial line longer than this (no newline yet) is written as it is
MAX_PARTIAL = 64 * 1024
#: suffix of the files holding unfinished last lines for ``seal`` (``combined.log.partial-0``)
PARTIAL_SUFFIX = ".partial-"
#: bytes waiting for the log writer before the pump stops reading CMD's pipes (backpressure)
DEFAULT_QUEUE_BYTES = 32 * 1024 * 1024
#: a full queue whose writer has not taken a batch for this long is dropped from (a hung disk)
STALL_SECONDS = 60.0
#: with more than this waiting, the writer only appends to the log and indexes later
PRESSURE_BYTES = 4 * 1024 * 1024
#: log blocks kept in memory for indexing later; beyond this they are read back from the file
PENDING_MEMORY = 4 * 1024 * 1024
#: below this much waiting, the writer sleeps BATCH_SECONDS to gather more per write
BATCH_BYTES = 256 * 1024
BATCH_SECONDS = 0.005
#: bytes indexed between two looks at the queue while catching up
INDEX_STEP = 2 * 1024 * 1024
READ_SIZE = 1024 * 1024
INDEX_HEADER = b"offset\tstream\twall_ns\tmono_ns\n"
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (not exported before Python 3.10 on every build)

STREAMS = ("out", "err")


class Writable(Protocol):
    def write(self, data: bytes | memoryview, /) -> object: ...


class ByteCounters(Protocol):
    """Totals kept where a SIGKILL cannot erase them (bundle/ledger.py ``Counters``)."""

    def add_received(self, nbytes: int, /) -> None: ...

    def add_shrink(self, nbytes: int, /) -> None: ...


@dataclass(frozen=True, slots=True)
class Loss:
    """Log data that could not be written (the pass-through still got it)."""

    member: str
    reason: str
    bytes: int
    lines: int
    first_at_ns: int

    def to_json(self) -> dict[str, object]:
        at = datetime.fromtimestamp(self.first_at_ns / 1e9, UTC).isoformat()
        return {
            "member": self.member,
            "reason": self.reason,
            "bytes": self.bytes,
            "lines": self.lines,
            "at": at,
        }


def _available(fd: int) -> int:
    """Bytes waiting in the pipe (FIONREAD), so that a read allocates what it returns: a
    1 MiB buffer shrunk to a few KiB per read fragments the heap of a long capture."""
    try:
        buf = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
        n = int.from_bytes(buf, sys.byteorder)
    except OSError:
        return READ_SIZE
    return min(max(n, 1), READ_SIZE)


def enlarge_pipe(fd: int, size: int = READ_SIZE) -> None:
    """Best effort: a bigger pipe buffer lets a bursty child run on while we are scheduled out."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", _F_SETPIPE_SZ), size)


def fd_writer(fd: int) -> Callable[[bytes | memoryview], None]:
    """A pass-through sink writing all of ``data`` to ``fd`` (blocking, like ``tee``)."""

    def write(data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(fd, view)
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue
            view = view[n:]

    return write


class LineRecorder:
    """Writes whole lines to the log and their receive times to the index (own thread)."""

    def __init__(
        self,
        log: BinaryIO | Writable,
        index: BinaryIO | Writable,
        *,
        redact: Callable[[bytes | memoryview], bytes | memoryview] | None = None,
        max_queue_bytes: int = DEFAULT_QUEUE_BYTES,
        on_first_loss: Callable[[str], None] | None = None,
        ledger: Callable[[dict[str, object]], None] | None = None,
        counters: ByteCounters | None = None,
        stall_seconds: float = STALL_SECONDS,
    ) -> None:
        self._log = _unbuffered(log)
        self._index = _unbuffered(index)
        self._streams = (log, index)
        self._redact = redact
        # ``redact`` may say where a long line can be cut safely (LogRedactor.safe_cut).
        cut = getattr(redact, "safe_cut", None)
        self._cut: Callable[[bytes], int] | None = cut if callable(cut) else None
        self._max_queue = max_queue_bytes
        self._on_first_loss = on_first_loss
        # Running totals for seal, kept where a SIGKILL or a full disk cannot erase them
        # (bundle/ledger.py): what was received, taken from the queue and dropped.
        self._ledger = ledger
        # ``received`` is counted by the pump before the pass-through (:meth:`arrived`), and
        # redaction's shrink after each log write: seal derives the exact loss from them.
        self._counters = counters
        self._stall = stall_seconds
        self._progress = 0  # batches taken from the queue (the pump waits on it)
        self.received = 0
        self._taken = 0
        self._dropped = 0
        self._queue: collections.deque[tuple[int, bytes | None, int, int]] = collections.deque()
        self._queued = 0
        self._cond = threading.Condition()
        self._closed = False
        self._partial: list[bytes] = [b"", b""]
        # What the tail files beside the log hold (see _save_partials).
        self._saved_partial: list[bytes] = [b"", b""]
        self._offset = 0
        self.lines_written = 0
        self.bytes_written = 0
        self._losses: dict[tuple[str, str], list[int]] = {}  # -> [bytes, lines, first_ns]
        self._loss_lock = threading.Lock()
        self._warned = False
        # Blocks written to the log but not yet indexed: (offset, length, bytes or None, stream,
        # wall, mono). Indexing costs ~4 ms per MB of short lines; during a flood it waits so
        # that the pump keeps up, and catches up when the writer is idle or at close.
        self._pending: collections.deque[
            tuple[int, int, bytes | memoryview | None, int, int, int]
        ] = collections.deque()
        self._pending_bytes = 0
        name = getattr(log, "name", None)
        self._log_path = name if isinstance(name, str) else None
        self._reader: int | None = None
        self._index_ok = self._safe_write(self._index, INDEX_HEADER, "logs/lines.tsv", 0)
        self._thread = threading.Thread(target=self._run, name="kk3-log-writer", daemon=True)
        self._thread.start()

    # -- producer side (pump thread) -------------------------------------------------------
    def arrived(self, nbytes: int) -> None:
        """Count a chunk as received before it is shown: a SIGKILL between the two leaves it
        counted (seal: lost) rather than shown and unaccounted."""
        if self._counters is not None:
            self._counters.add_received(nbytes)

    def put(self, stream: int, data: bytes, wall_ns: int, mono_ns: int) -> None:
        """Queue ``data`` for the log; while the queue is full, wait for the writer (the pump
        then stops reading, CMD blocks on its pipe). Dropped only when the writer is gone or
        has taken nothing for ``stall_seconds``."""
        with self._cond:
            self.received += len(data)
            reason = self._wait_for_room(len(data))
            if reason is None:
                self._queue.append((stream, data, wall_ns, mono_ns))
                self._queued += len(data)
                self._cond.notify_all()
            else:
                self._dropped += len(data)
        if reason is not None:
            self._lose(reason, len(data), data.count(b"\n"))

    def _wait_for_room(self, nbytes: int) -> str | None:
        """Called holding ``_cond``; ``None`` once there is room, else why not."""
        progress = self._progress
        since = time.monotonic()
        while self._queued and self._queued + nbytes > self._max_queue:
            if not self._thread.is_alive():
                return "log writer stopped"
            self._cond.wait(min(1.0, self._stall))
            if self._progress != progress:
                progress, since = self._progress, time.monotonic()
            elif time.monotonic() - since >= self._stall:
                return f"log writer stalled for {self._stall:g} s (queue full)"
        return None

    def eof(self, stream: int) -> None:
        with self._cond:
            self._queue.append((stream, None, time.time_ns(), time.monotonic_ns()))
            self._cond.notify()

    def close(self, timeout: float | None = None) -> bool:
        """Ask the writer to finish what is queued; ``True`` when it did within ``timeout``."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def losses(self) -> list[Loss]:
        with self._loss_lock:
            return [Loss(m, r, v[0], v[1], v[2]) for (m, r), v in self._losses.items()]

    # -- writer thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    break
                small = self._queued < BATCH_BYTES and not self._closed
            if small:
                # A trickle of output: gather a few ms of it per write, so that this thread
                # wakes (and takes the GIL from the pump) at most a few hundred times a second.
                time.sleep(BATCH_SECONDS)
            # Take up to a few MiB at a time; they count against the queue's bound until they
            # are written, so the bound holds for everything in flight (memory stays flat).
            with self._cond:
                batch = []
                size = 0
                while self._queue and size < INDEX_STEP:
                    item = self._queue.popleft()
                    batch.append(item)
                    size += len(item[1]) if item[1] is not None else 0
            for stream, data, wall, mono in batch:
                self._take(stream, data, wall, mono)
            with self._cond:
                self._queued -= size
                self._progress += 1
                self._cond.notify_all()  # the pump may be waiting for room
            if self._queued < PRESSURE_BYTES:
                self._index_pending(budget=INDEX_STEP)
            # Each batch reaches the OS at once: a SIGKILLed shim loses nothing it wrote.
            self._flush()
            self._save_partials()
            self._taken += size
            self._note(final=False)
        for stream in (0, 1):
            if self._partial[stream]:
                self._emit(stream, self._partial[stream], time.time_ns(), time.monotonic_ns())
                self._partial[stream] = b""
        self._index_pending()
        self._flush()
        self._save_partials()
        self._note(final=True)
        if self._reader is not None:
            with contextlib.suppress(OSError):
                os.close(self._reader)

    def _note(self, *, final: bool) -> None:
        if self._ledger is None:
            return
        with self._cond:
            received, dropped = self.received, self._dropped
        with contextlib.suppress(Exception):
            self._ledger(
                {
                    "received_bytes": received,
                    "written_bytes": self._taken,
                    "dropped_bytes": dropped,
                    "log_bytes": self.bytes_written,
                    "losses": [loss.to_json() for loss in self.losses],
                    "final": final,
                }
            )

    def _flush(self) -> None:
        names = ("logs/combined.log", "logs/lines.tsv")
        for member, stream in zip(names, self._streams, strict=True):
            flush = getattr(stream, "flush", None)
            if flush is None:
                continue
            try:
                flush()
            except (OSError, ValueError) as exc:
                self._lose(_describe(exc), 0, 0, member=member)

    def _save_partials(self) -> None:
        """Keep each stream's unfinished last line (redacted) in a tail file beside the log.

        A line without its newline yet lives only in memory; if the shim is SIGKILLed then,
        ``seal`` appends these tails (``<log>.partial-<stream>``: the log's size when saved, a
        newline, the bytes) so nothing received is lost. The files go away once the line is
        complete or the recorder closes normally.
        """
        if self._log_path is None:
            return
        for stream in (0, 1):
            current = self._partial[stream]
            if current == self._saved_partial[stream]:
                continue
            path = f"{self._log_path}{PARTIAL_SUFFIX}{stream}"
            try:
                if current:
                    data = self._redact(current) if self._redact is not None else current
                    with open(path + ".tmp", "wb") as fp:
                        # The log size now: if the shim dies after the line is completed in
                        # the log but before this file is updated, seal finds the line at or
                        # after this offset and knows the tail is stale.
                        fp.write(b"%d\n" % self._offset)
                        fp.write(data)
                    os.replace(path + ".tmp", path)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                self._saved_partial[stream] = current
            except OSError as exc:
                self._lose(_describe(exc), 0, 0, member="logs/combined.log")

    def _take(self, stream: int, data: bytes | None, wall: int, mono: int) -> None:
        if data is None:  # EOF: the last partial line is a line of its own
            if self._partial[stream]:
                self._emit(stream, self._partial[stream], wall, mono)
                self._partial[stream] = b""
            return
        partial = self._partial[stream]
        last = data.rfind(b"\n")
        if last < 0:
            buf = partial + data
        else:
            # Whole lines go out without copying the chunk: the line that started in an
            # earlier chunk (small) and a view of the rest up to the last newline.
            start = 0
            if partial:
                start = data.find(b"\n") + 1
                self._emit(stream, partial + data[:start], wall, mono)
            if start == 0 and last + 1 == len(data):
                self._emit(stream, data, wall, mono)
            elif start <= last:
                self._emit(stream, memoryview(data)[start : last + 1], wall, mono)
            buf = data[last + 1 :]
        if len(buf) > MAX_PARTIAL:
            # Write the head of a long unfinished line now, but never cut a secret in two
            # (each piece is redacted on its own): the redactor picks the cut and a tail waits.
            cut = self._cut(buf) if self._cut is not None else len(buf)
            self._emit(stream, buf[:cut], wall, mono)
            buf = buf[cut:]
        self._partial[stream] = buf

    def _emit(self, stream: int, block: bytes | memoryview, wall: int, mono: int) -> None:
        taken = len(block)
        if self._redact is not None:
            try:
                block = self._redact(block)
            except Exception as exc:
                # Without redaction the line may hold a secret: drop it rather than store it.
                self._lose(f"redaction failed: {type(exc).__name__}", len(block), 1)
                return
        written = self._safe_write(self._log, block, "logs/combined.log", -1)
        if self._counters is not None:
            # After the write: a SIGKILL in between misses this block's shrink (if any).
            # A failed write is recorded as lost in written bytes, so it shrinks too.
            self._counters.add_shrink(taken - len(block))
        if not written:
            return
        keep = self._log_path is None or self._pending_bytes + len(block) <= PENDING_MEMORY
        self._pending.append(
            (self._offset, len(block), block if keep else None, stream, wall, mono)
        )
        if keep:
            self._pending_bytes += len(block)
        self._offset += len(block)
        self.bytes_written += len(block)

    def _index_pending(self, budget: int | None = None) -> None:
        """One ``lines.tsv`` row per line of the blocks written but not yet indexed (about
        ``budget`` bytes of them, or all), oldest first."""
        done = 0
        while self._pending and (budget is None or done < budget):
            offset, length, kept, stream, wall, mono = self._pending.popleft()
            done += length
            if kept is not None:
                self._pending_bytes -= length
                block = kept if isinstance(kept, bytes) else kept.tobytes()
            else:
                back = self._read_back(offset, length)
                if back is None:
                    continue
                block = back
            parts = block.split(b"\n")
            n = len(parts) - 1 if block.endswith(b"\n") else len(parts)
            starts = accumulate(map(add, map(len, parts), repeat(1)), initial=offset)
            sep = f"\t{STREAMS[stream]}\t{wall}\t{mono}\n"
            rows = sep.join(map(str, islice(starts, n))) + sep
            self._safe_write(self._index, rows.encode("ascii"), "logs/lines.tsv", n)
            self.lines_written += n

    def _read_back(self, offset: int, length: int) -> bytes | None:
        try:
            if self._reader is None:
                assert self._log_path is not None
                self._reader = os.open(self._log_path, os.O_RDONLY)
            data = os.pread(self._reader, length, offset)
            if len(data) != length:
                raise OSError(0, f"short read of the log ({len(data)} of {length} bytes)")
        except OSError as exc:
            self._lose(f"index: {_describe(exc)}", 0, 0, member="logs/lines.tsv")
            return None
        return data

    def _safe_write(
        self,
        write: Callable[[bytes | memoryview], object],
        data: bytes | memoryview,
        member: str,
        lines: int,
    ) -> bool:
        try:
            write(data)
        except (OSError, ValueError) as exc:
            reason = _describe(exc)
            if lines < 0:  # counted only when lost (counting costs ~1 ms per MB)
                raw = bytes(data)
                lines = raw.count(b"\n") + (0 if raw.endswith(b"\n") else 1)
            self._lose(reason, len(data), lines, member=member)
            return False
        return True

    def _lose(
        self, reason: str, nbytes: int, lines: int, member: str = "logs/combined.log"
    ) -> None:
        with self._loss_lock:
            rec = self._losses.setdefault((member, reason), [0, 0, time.time_ns()])
            rec[0] += nbytes
            rec[1] += lines
            first = not self._warned
            self._warned = True
        if first and self._on_first_loss is not None:
            with contextlib.suppress(Exception):
                self._on_first_loss(
                    f"cannot record output to {member} ({reason}); still passing it "
                    "through, the loss is recorded in the bundle"
                )


def _unbuffered(stream: BinaryIO | Writable) -> Callable[[bytes | memoryview], object]:
    """Write straight to the file descriptor when there is one (nothing held in a buffer)."""
    try:
        fd = stream.fileno()  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):
        return stream.write
    flush = getattr(stream, "flush", None)
    if flush is not None:
        flush()
    return fd_writer(fd)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc.strerror}"
    return f"{type(exc).__name__}: {exc}"


class Pump:
    """Reads the child's pipes in one thread; pass-through first, then the recorder."""

    def __init__(
        self,
        fds: tuple[int, int],
        sinks: tuple[Callable[[bytes], None], Callable[[bytes], None]],
        recorder: LineRecorder | None,
    ) -> None:
        self._fds = fds
        self._sinks = list(sinks)
        self._sink_dead = [False, False]
        self._recorder = recorder
        self._stop_at: float | None = None
        self.bytes_seen = [0, 0]
        self.sink_errors: list[str] = []
        for fd in fds:
            enlarge_pipe(fd)
        self._thread = threading.Thread(target=self._run, name="kk3-pump", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop_after(self, seconds: float) -> None:
        """Stop reading ``seconds`` from now even if a pipe is still open (a leftover holder)."""
        self._stop_at = time.monotonic() + seconds

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        for i, fd in enumerate(self._fds):
            sel.register(fd, selectors.EVENT_READ, i)
        open_count = len(self._fds)
        try:
            while open_count:
                if self._stop_at is not None and time.monotonic() >= self._stop_at:
                    break
                for key, _ in sel.select(timeout=0.2):
                    i = int(key.data)
                    fd = self._fds[i]
                    try:
                        data = os.read(fd, _available(fd))
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(fd)
                        open_count -= 1
                        if self._recorder is not None:
                            self._recorder.eof(i)
                        continue
                    wall = time.time_ns()
                    mono = time.monotonic_ns()
                    self.bytes_seen[i] += len(data)
                    if self._recorder is not None:
                        self._recorder.arrived(len(data))
                    if not self._sink_dead[i]:
                        try:
                            self._sinks[i](data)
                        except (OSError, ValueError) as exc:
                            # Our own stdout went away (closed terminal, `| head`): keep
                            # recording, as tee -p would.
                            self._sink_dead[i] = True
                            self.sink_errors.append(f"{STREAMS[i]}: {_describe(exc)}")
                    if self._recorder is not None:
                        self._recorder.put(i, data, wall, mono)
        finally:
            for key in list(sel.get_map().values()):
                if self._recorder is not None:
                    self._recorder.eof(int(key.data))
            sel.close()
