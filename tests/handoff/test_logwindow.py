"""LineCursor (issue 16): the lines a report shows, found at C speed, equal to a line-by-line
reading of the same bytes whatever the chunk size and line lengths."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from bundle_factory import write_bundle
from hypothesis import given, settings
from hypothesis import strategies as st

from kk3evidence.handoff.evidence import _stream_windows, _windows, load
from kk3evidence.handoff.logwindow import LineCursor

texts = st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"-")), max_size=50)


def _lines(log: bytes) -> list[bytes]:
    """Lines ended by ``\n`` only (``\r`` stays inside), the last may lack it."""
    parts = log.split(b"\n")
    return [p + b"\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


@settings(max_examples=300, deadline=None)
@given(texts, st.booleans(), st.integers(1, 40), st.integers(1, 60), st.integers(1, 8),
       st.integers(1, 40))
def test_skip_read_and_tail_match_a_plain_split(
    body: list[bytes], final_nl: bool, chunk: int, target: int, count: int, keep: int
) -> None:
    log = b"\n".join(body) + (b"\n" if final_nl and body else b"")
    want = _lines(log)
    cur = LineCursor(io.BytesIO(log), chunk=chunk)
    cur.skip_to(target)
    got = cur.read(keep)
    if target <= len(want):
        assert got is not None
        assert got == (want[target - 1][:keep], len(want[target - 1]))
        tail_from = target + 1
    else:
        assert got is None
        tail_from = len(want) + 1
    seen, tail = cur.tail(count, keep, (tail_from + 1, tail_from + 3))
    rest = list(enumerate(want, start=1))[tail_from - 1 :]
    assert [(no, raw[:keep], len(raw)) for no, raw in rest[-count:]] == tail
    assert [(no, raw[:keep], len(raw)) for no, raw in rest[1:4]] == seen


@settings(max_examples=200, deadline=None)
@given(texts, st.booleans(), st.one_of(st.none(), st.integers(1, 70)))
def test_stream_windows_equal_the_line_by_line_windows(
    body: list[bytes], final_nl: bool, target: int | None
) -> None:
    log = b"\n".join(body) + (b"\n" if final_nl and body else b"")
    slow = _windows(_lines(log), target)
    fast = _stream_windows(io.BytesIO(log), target)
    assert fast == slow


def test_long_lines_are_cut_and_counted() -> None:
    log = b"a\n" + b"x" * 100_000 + b"\nb\n" + b"y" * 50_000
    cur = LineCursor(io.BytesIO(log), chunk=4096)
    cur.skip_to(2)
    assert cur.read(10) == (b"x" * 10, 100_001)
    assert cur.tail(5, 10) == ([], [(3, b"b\n", 2), (4, b"y" * 10, 50_000)])


@pytest.mark.parametrize("log", [
    b"INFO a\n" * 3000 + b"RuntimeError: CUDA error: out of memory\n" + b"INFO b\n" * 40,
    b"INFO a\n" * 5 + b"RuntimeError: CUDA error: out of memory\n" + b"z" * 3_000_000,
    b"x" * 2_500_000 + b"\nRuntimeError: CUDA error: out of memory\nlast",
    b"INFO only\n",
])
def test_load_shows_the_same_lines_as_a_full_pass(tmp_path: Path, log: bytes) -> None:
    """load() keeps the last lines from its analysis pass and reads only up to the failure's
    window afterwards: what it shows equals one full line-by-line pass."""
    ev = load(write_bundle(tmp_path / "b.tar.gz", log=log))
    ff = ev.analysis["first_failure"] if ev.analysis else None
    target = ff["line_no"] if ff else None
    window, tail = _windows(_lines(log), target)
    assert (ev.log_window, ev.log_tail) == (window, tail)
