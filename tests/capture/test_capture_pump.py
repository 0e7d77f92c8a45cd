"""The line recorder: whatever the chunking, combined.log + lines.tsv give back each stream."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from progs.helpers import per_stream

from kk3evidence.capture import pump as _pump
from kk3evidence.capture.pump import LineRecorder

chunks = st.lists(
    st.tuples(st.integers(0, 1), st.binary(max_size=300).map(lambda b: b.replace(b"\r", b"\n"))),
    max_size=40,
)


def _record(parts: list[tuple[int, bytes]], log: object, index: object) -> LineRecorder:
    rec = LineRecorder(log, index)  # type: ignore[arg-type]
    for stream, data in parts:
        if data:
            rec.put(stream, data, time.time_ns(), time.monotonic_ns())
    rec.eof(0)
    rec.eof(1)
    assert rec.close(30)
    return rec


@settings(max_examples=200, deadline=None)
@given(chunks)
def test_streams_are_rebuilt_exactly_from_log_and_index(parts: list[tuple[int, bytes]]) -> None:
    log, index = io.BytesIO(), io.BytesIO()
    rec = _record(parts, log, index)
    got = per_stream(log.getvalue(), index.getvalue())
    want = {
        "out": b"".join(d for s, d in parts if s == 0),
        "err": b"".join(d for s, d in parts if s == 1),
    }
    assert got == want
    assert rec.losses == []
    offsets = [int(r.split("\t")[0]) for r in index.getvalue().decode().splitlines()[1:]]
    assert offsets == sorted(set(offsets))  # one row per line, in log order
    assert len(offsets) == rec.lines_written


def test_a_line_longer_than_the_limit_is_written_in_pieces() -> None:
    log, index = io.BytesIO(), io.BytesIO()
    big = b"x" * (_pump.MAX_PARTIAL + 10)
    _record([(0, big), (0, b"tail\n")], log, index)
    assert log.getvalue() == big + b"tail\n"
    assert len(index.getvalue().decode().splitlines()) == 1 + 2


def test_index_read_back_from_the_file_under_pressure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tiny limits force the flood path: blocks are indexed later, read back from the log file.
    monkeypatch.setattr(_pump, "PENDING_MEMORY", 10)
    monkeypatch.setattr(_pump, "PRESSURE_BYTES", 0)
    parts = [(i % 2, b"line %d of stream %d\n" % (i, i % 2) * 3) for i in range(200)]
    with open(tmp_path / "c.log", "ab") as log, open(tmp_path / "l.tsv", "ab") as index:
        rec = _record(parts, log, index)
    got = per_stream((tmp_path / "c.log").read_bytes(), (tmp_path / "l.tsv").read_bytes())
    assert got["out"] == b"".join(d for s, d in parts if s == 0)
    assert got["err"] == b"".join(d for s, d in parts if s == 1)
    assert rec.lines_written == 600


def test_a_failing_log_records_the_loss_and_keeps_going() -> None:
    class Full:
        def write(self, data: bytes) -> int:
            raise OSError(28, "No space left on device")

    messages: list[str] = []
    rec = LineRecorder(Full(), io.BytesIO(), on_first_loss=messages.append)
    rec.put(0, b"a\nb\n", 1, 1)
    rec.put(1, b"c\n", 1, 1)
    assert rec.close(30)
    (loss,) = rec.losses
    assert loss.member == "logs/combined.log" and loss.bytes == 6 and loss.lines == 3
    assert "ENOSPC" in loss.reason
    assert len(messages) == 1 and "still passing it through" in messages[0]


def test_log_redactor_matches_the_full_redactor_and_learns_from_log_lines() -> None:
    from kk3evidence.bundle.redact import Redactor
    from kk3evidence.capture.run import LogRedactor, known_secrets

    env = {"HF_TOKEN": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "HOME": "/root"}
    full, fast = Redactor(), Redactor()
    full.env(env)
    fast.env(env)
    lines = [
        b"INFO loading weights\n",
        b"token hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789 in the log\n",
        b"url-quoted too: hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789%0A\n",
        b"db password=s3cretValue99 set\n",
        b"again the bare value s3cretValue99 later\n",
        b"Authorization: Bearer abcdefghijklmnop\n",
        b"plain line\n",
    ]
    redact = LogRedactor(fast, known_secrets(env, []))
    got = b"".join(bytes(redact(line)) for line in lines)
    want = b"".join(full.text(line) for line in lines)
    assert got == want
    assert b"s3cretValue99" not in got and b"hf_AbCd" not in got


def test_a_full_queue_holds_the_producer_back_instead_of_dropping(tmp_path: Path) -> None:
    """Backpressure: a flood ten times the queue's bound reaches the log whole, and what is
    queued or being written never exceeds the bound."""
    bound = 4096
    seen: list[int] = []

    class Log(io.BytesIO):
        def write(self, data: bytes | memoryview, /) -> int:  # type: ignore[override]
            seen.append(rec._queued)
            return super().write(data)

    log = Log()
    rec = LineRecorder(log, io.BytesIO(), max_queue_bytes=bound)
    parts = [b"line %05d %s\n" % (i, b"y" * 990) for i in range(40)]
    for part in parts:
        rec.put(0, part, 1, 1)
    rec.eof(0)
    assert rec.close(30)
    assert rec.losses == []
    assert log.getvalue() == b"".join(parts)
    assert seen and max(seen) <= bound


def test_a_writer_that_takes_nothing_for_the_stall_time_gets_its_overflow_dropped() -> None:
    """Only a stuck writer (a hung disk) makes the pump drop: the chunk that found the queue
    full and the writer stuck for ``stall_seconds`` is counted lost, the rest is written."""
    import threading

    entered, gate = threading.Event(), threading.Event()

    class Hung(io.BytesIO):
        def write(self, data: bytes | memoryview, /) -> int:  # type: ignore[override]
            entered.set()
            gate.wait()
            return super().write(data)

    log = Hung()
    rec = LineRecorder(log, io.BytesIO(), max_queue_bytes=10, stall_seconds=0.05)
    chunks = [b"%09d\n" % i for i in range(3)]
    rec.put(0, chunks[0], 1, 1)
    entered.wait()  # the writer holds chunk 0 (still counted against the bound) and hangs
    rec.put(0, chunks[1], 1, 1)
    rec.put(0, chunks[2], 1, 1)
    gate.set()
    rec.eof(0)
    assert rec.close(30)
    (loss,) = rec.losses
    assert "stalled" in loss.reason and loss.bytes == 20 and loss.lines == 2
    assert log.getvalue() == chunks[0]


def test_counters_see_every_byte_received_and_what_redaction_shrank() -> None:
    from kk3evidence.bundle.redact import Redactor
    from kk3evidence.capture.run import LogRedactor, known_secrets

    class Counts:
        received = 0
        shrink = 0

        def add_received(self, n: int) -> None:
            self.received += n

        def add_shrink(self, n: int) -> None:
            self.shrink += n

    env = {"HF_TOKEN": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"}
    redactor = Redactor()
    redactor.env(env)
    counts = Counts()
    log = io.BytesIO()
    rec = LineRecorder(
        log, io.BytesIO(), redact=LogRedactor(redactor, known_secrets(env, [])), counters=counts
    )
    parts = [b"plain\n", b"token hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789 here\n", b"end"]
    for part in parts:
        rec.arrived(len(part))
        rec.put(0, part, 1, 1)
    rec.eof(0)
    assert rec.close(30)
    assert counts.received == sum(map(len, parts))
    assert len(log.getvalue()) + counts.shrink == counts.received
    assert counts.shrink != 0
