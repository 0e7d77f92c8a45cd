"""Budgeted analysis (issue 16): a stream cap for endless input, head + tail for huge logs;
line numbers stay the file's and the coverage says what was analysed."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kk3evidence.analysis.budget import Budget, budgeted, coverage, describe
from kk3evidence.analysis.engine import analyze

CORPUS = Path(__file__).resolve().parents[2] / "corpus"

lines = st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b".")), max_size=60)


def _chunks(data: bytes, sizes: list[int]) -> list[bytes]:
    out, pos, i = [], 0, 0
    while pos < len(data):
        n = sizes[i % len(sizes)] if sizes else len(data)
        out.append(data[pos : pos + n])
        pos += n
        i += 1
    return out


@settings(max_examples=300, deadline=None)
@given(lines, st.booleans(), st.lists(st.integers(1, 50), min_size=1, max_size=5),
       st.integers(0, 400), st.integers(0, 400))
def test_head_and_tail_keep_the_files_line_numbers(
    body: list[bytes], final_nl: bool, sizes: list[int], head: int, tail: int
) -> None:
    log = b"\n".join(body) + (b"\n" if final_nl and body else b"")
    pieces, tally = budgeted(_chunks(log, sizes), Budget(head, tail))
    got = list(pieces)
    kinds = [p.kind for p in got]
    assert kinds.count("skip") <= 1
    split = kinds.index("skip") if "skip" in kinds else len(got)
    before = b"".join(p.data for p in got[:split])
    after = b"".join(p.data for p in got[split + 1 :])
    skipped = got[split].lines if split < len(got) else 0
    cov = coverage(tally, Budget(head, tail))
    if split == len(got):  # nothing skipped: everything was analysed, in order
        assert before == log and cov.complete and cov.skipped_lines is None
        return
    assert not cov.complete and cov.ended
    # The head is the file's start (its cut last line is ended by one added newline).
    # (When the cut falls just before a newline, the added one equals the file's own byte: the
    # head is then one byte longer than the budget and still a prefix of the file.)
    added_nl = not log.startswith(before) or len(before) > head
    real_head = before[:-1] if added_nl else before
    assert log.startswith(real_head)
    assert len(real_head) <= head
    # The tail is the file's end, starting on a line of its own, within the budget.
    assert log.endswith(after) and len(after) <= tail
    start = len(log) - len(after)
    if not after:  # the tail held nothing: the count covers every line of the file
        total = log.count(b"\n") + (0 if log.endswith(b"\n") else 1)
        assert before.count(b"\n") + skipped == total
    else:
        assert start == 0 or log[start - 1 : start] == b"\n"
        # Every tail line gets its number in the file.
        assert before.count(b"\n") + skipped == log.count(b"\n", 0, start)
    assert cov.bytes_analysed == len(real_head) + len(after)
    assert cov.bytes_read == len(log)


@given(st.binary(max_size=500), st.lists(st.integers(1, 64), min_size=1, max_size=4),
       st.integers(0, 600))
def test_a_stream_cap_reads_no_further(data: bytes, sizes: list[int], cap: int) -> None:
    blocks = _chunks(data, sizes)
    consumed = []

    def source():  # type: ignore[no-untyped-def]
        for b in blocks:
            consumed.append(b)
            yield b

    pieces, tally = budgeted(source(), Budget(cap))
    assert b"".join(p.data for p in pieces) == data[:cap]
    cov = coverage(tally, Budget(cap))
    assert cov.ended == (len(data) <= cap)
    # Reading stops at the block that reached the cap: an endless source ends.
    assert sum(map(len, consumed)) < cap + max(sizes) + 1


def _composite() -> bytes:
    fail = (CORPUS / "realrun-fail-kv-cache-too-small" / "output.log").read_bytes()
    ok = (CORPUS / "realrun-ok-baseline" / "output.log").read_bytes()
    noise = b"(APIServer pid=1) INFO 12-01 00:00:01 [loggers.py:1] Avg prompt throughput\n"
    return fail + noise * 5000 + ok + noise * 5000 + fail


def test_findings_in_the_head_and_the_tail_keep_the_full_analysis_line_numbers() -> None:
    log = _composite()
    full = analyze(io.BytesIO(log))
    part = analyze(io.BytesIO(log), budget=Budget(len(log) // 10, len(log) // 10, lift="--full"))
    assert full.coverage is None and part.coverage is not None
    assert part.lines_total == full.lines_total
    got = {(f.line_no, f.rule) for f in part.findings}
    assert got and got <= {(f.line_no, f.rule) for f in full.findings}
    assert part.first_failure is not None and full.first_failure is not None
    assert part.first_failure.line_no == full.first_failure.line_no
    assert max(f.line_no for f in part.findings) == max(f.line_no for f in full.findings)
    doc = part.to_json()["coverage"]
    lo, hi = doc["skipped_lines"]
    assert 1 < lo <= hi < full.lines_total
    assert "--full" in describe(doc) and f"lines {lo}-{hi}" in describe(doc)


def test_a_budget_the_log_fits_changes_nothing() -> None:
    log = _composite()
    a = analyze(io.BytesIO(log)).to_json()
    b = analyze(io.BytesIO(log), budget=Budget(len(log), 0)).to_json()
    assert a == b and "coverage" not in b


def test_negative_budgets_are_refused() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        Budget(-1)


def test_the_coverage_field_matches_the_analysis_schema() -> None:
    from kk3evidence.bundle.schema import iter_schema_problems

    log = _composite()
    doc = analyze(io.BytesIO(log), budget=Budget(1000, 1000)).to_json()
    assert "coverage" in doc
    name = "analysis"
    assert list(iter_schema_problems(name, doc, "analysis.json")) == []
    doc["coverage"]["complete"] = "no"
    assert list(iter_schema_problems(name, doc, "analysis.json"))


class _SmallReads:
    def __init__(self, data: bytes, n: int) -> None:
        self._b = io.BytesIO(data)
        self._n = n

    def read(self, size: int = -1) -> bytes:
        return self._b.read(self._n)


@pytest.mark.parametrize("long", [3_000_000, 500_000])  # past and under the engine's 1 MiB cut
@pytest.mark.parametrize("read", [4096, 1 << 20])
@pytest.mark.parametrize("into", [100, 400_000])  # the head ends inside the long line
def test_a_head_cut_inside_a_long_line_keeps_line_numbers(long: int, read: int, into: int) -> None:
    fail = b"RuntimeError: CUDA error: out of memory\n"
    log = b"INFO a\n" * 1000 + b"y" * long + b"\n" + b"INFO b\n" * 20_000 + fail + b"INFO c\n"
    full = analyze(io.BytesIO(log))
    part = analyze(_SmallReads(log, read), budget=Budget(7000 + into, 10_000))
    assert part.lines_total == full.lines_total
    assert [f.line_no for f in part.findings] == [f.line_no for f in full.findings]
    assert part.coverage is not None and part.coverage["skipped_lines"][0] in (1001, 1002)
