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
