"""The live progress line: drawn while CMD is quiet, erased before CMD's output, plain off a
terminal; and the watchdog's status text."""

from __future__ import annotations

import os
from pathlib import Path

from kk3evidence.capture.progress import ProgressLine
from kk3evidence.capture.watchdog import StallPolicy, Watchdog


def _read_all(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return b""


def test_on_a_terminal_the_line_is_erased_before_the_commands_output() -> None:
    r, w = os.pipe()
    try:
        line = ProgressLine(w, tty=True)
        got: list[bytes] = []

        def passthrough(data: bytes) -> None:
            got.append(data)
            os.write(w, data)

        sink = line.wrap(passthrough)
        line.show("comm_group 5s · silent 5s")  # CMD has been quiet: drawn
        sink(b"hello\n")
        line.show("comm_group 6s")  # CMD just wrote: not drawn over its output
        out = _read_all(r)
    finally:
        os.close(r)
        os.close(w)
    assert out == b"\r\x1b[2Kkk3evidence: comm_group 5s \xc2\xb7 silent 5s\r\x1b[2Khello\n"
    assert got == [b"hello\n"]


def test_off_a_terminal_a_plain_line_is_written_when_the_stage_changes() -> None:
    r, w = os.pipe()
    try:
        line = ProgressLine(w, tty=False)
        line.show("starting 0s · output starting")
        line.show("starting 1s · 1.0 KiB/s")
        line.show("engine_init 0s · last: x")
        out = _read_all(r).decode()
    finally:
        os.close(r)
        os.close(w)
    assert out.splitlines() == [
        "kk3evidence: progress: starting 0s · output starting",
        "kk3evidence: progress: engine_init 0s · last: x",
    ]


def test_the_status_text_says_stage_time_last_milestone_and_silence(tmp_path: Path) -> None:
    log = tmp_path / "combined.log"
    log.write_bytes(
        b"(EngineCore pid=1) INFO 12-01 03:00:00 [core.py:1] Loading weights took 3.20 seconds\n"
    )
    now = [100.0]
    dog = Watchdog(
        StallPolicy(),
        log_path=str(log),
        bytes_seen=lambda: 10,
        root_pid=os.getpid(),
        ready=lambda: False,
        alive=lambda: True,
        save=lambda _n, _d: None,
        stop=lambda _w: None,
        say=lambda _m: None,
        clock=lambda: now[0],
    )
    now[0] = 101.0
    dog._observe(now[0])
    now[0] = 131.0
    text = dog.status_line(now[0])
    dog.close()
    assert text.startswith("weights_access 30s")
    assert "Loading weights took 3.20 seconds" in text and "silent 30s" in text
