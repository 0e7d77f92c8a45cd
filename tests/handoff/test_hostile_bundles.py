"""Bundles made to hurt their reader: every consumer gives a bounded answer or a clear refusal.
Assertions are on behaviour (what is kept, what is printed, what is refused), never timings."""

from __future__ import annotations

import gzip
import random
import tracemalloc
from pathlib import Path

import pytest
from bundle_factory import launch_doc, write_bundle
from click.testing import CliRunner

from kk3evidence.bundle.archive import open_bundle, validate
from kk3evidence.bundle.tarsafe import Limits
from kk3evidence.cli import main
from kk3evidence.handoff import evidence as _evidence
from kk3evidence.handoff.evidence import load

MiB = 1024 * 1024


def _noise(n: int, seed: int = 1) -> bytes:
    """Bytes that gzip compresses about 4:1 (under the bomb ratio), unlike runs of one byte."""
    rnd = random.Random(seed)
    return bytes(rnd.choice(b"abcd") for _ in range(n))


def _huge_line_bundle(tmp_path: Path) -> Path:
    head = b"(EngineCore_DP0 pid=12) ERROR "
    line = head + _noise(MiB) * 8 + b"\n"  # an 8 MiB line, twice, around a real failure
    log = b"INFO start\n" + line + b"RuntimeError: CUDA error: out of memory\n" + line
    return write_bundle(tmp_path / "huge.tar.gz", log=log)


def test_huge_log_lines_are_cut_for_display_and_keep_line_numbers(tmp_path: Path) -> None:
    bundle = _huge_line_bundle(tmp_path)
    assert validate(bundle) == []
    tracemalloc.start()
    try:
        ev = load(bundle)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    shown = [ln.text for ln in (*ev.log_window, *ev.log_tail)]
    assert shown and max(len(t) for t in shown) < _evidence.MAX_SHOWN_LINE + 64
    assert any("more bytes]" in t for t in shown)
    assert ev.first_failure is not None and ev.first_failure["line_no"] == 3
    # Two 8 MiB lines, yet what is kept follows what is shown: lines are read 1 MiB at a time.
    assert peak < 48 * MiB


def test_report_diff_compare_output_stays_small_on_huge_lines(tmp_path: Path) -> None:
    bundle = str(_huge_line_bundle(tmp_path))
    runner = CliRunner()
    for args in (["report", bundle], ["diff", bundle, bundle], ["compare", bundle, bundle]):
        res = runner.invoke(main, args)
        assert res.exit_code in (0, 5, 6), (args, res.output[-500:])
        assert len(res.output) < 200_000, args
        assert max(map(len, res.output.splitlines())) < 10_000, args


def test_lines_tsv_is_read_only_up_to_the_lines_a_report_shows(tmp_path: Path) -> None:
    rows = b"".join(b"%d\tout\t%d\t%d\n" % (i * 8, 10**18 + i, i) for i in range(200_000))
    bundle = write_bundle(
        tmp_path / "rows.tar",
        log=b"INFO a\nRuntimeError: CUDA error: out of memory\n",
        extra={"logs/lines.tsv": b"offset\tstream\twall_ns\tmono_ns\n" + rows},
    )
    with open_bundle(bundle) as b:
        times = _evidence._line_times(b, {2})
    assert set(times) == {1, 2}


def test_a_lines_tsv_row_without_newlines_is_read_in_bounded_pieces(tmp_path: Path) -> None:
    bundle = write_bundle(
        tmp_path / "row.tar",
        extra={"logs/lines.tsv": b"offset\tstream\twall_ns\tmono_ns\n" + b"9" * (4 * MiB)},
    )
    with open_bundle(bundle) as b:
        assert _evidence._line_times(b) == {}


def test_oversized_metrics_make_a_bundle_invalid(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "m.tar", extra={"metrics/after.prom": b"vllm:x 1\n" * 200})
    problems = validate(bundle, limits=Limits(max_text_bytes=1024))
    assert problems[0].code == "member-too-large"
    assert problems[0].member == "metrics/after.prom"
    assert Limits().max_text_bytes == 32 * MiB


def test_a_huge_gzip_file_name_header_is_refused_at_once(tmp_path: Path) -> None:
    plain = write_bundle(tmp_path / "p.tar").read_bytes()
    body = gzip.compress(plain)[10:]
    header = b"\x1f\x8b\x08\x08\0\0\0\0\0\xff" + b"A" * (8 * MiB) + b"\0"
    bad = tmp_path / "name.tar.gz"
    bad.write_bytes(header + body)
    problems = validate(bad)
    assert [p.code for p in problems] == ["header-too-large"]
    assert "gzip header" in problems[0].message
    ok = tmp_path / "short-name.tar.gz"
    ok.write_bytes(b"\x1f\x8b\x08\x08\0\0\0\0\0\xffrun.tar\0" + body)
    assert validate(ok) == []


@pytest.fixture
def odd_bundles(tmp_path: Path) -> dict[str, str]:
    odd = launch_doc()
    odd["argv"] = [*odd["argv"], "--x", "\ud800lone\x1b[31mRED\x00nul\u202e"]
    big = launch_doc(exit_code=2**63 + 5, exit_status=2**63 + 5)
    log = b"INFO ok\n\x1b]0;title\x07 evil\x00 \x1b[2J\n"
    return {
        "odd": str(write_bundle(tmp_path / "odd.tar", documents={"launch.json": odd}, log=log)),
        "big": str(write_bundle(tmp_path / "big.tar", documents={"launch.json": big})),
        "plain": str(write_bundle(tmp_path / "plain.tar")),
    }


@pytest.mark.parametrize(
    "args",
    [
        ["diff", "odd", "plain"],
        ["diff", "--json", "odd", "plain"],
        ["report", "odd"],
        ["compare", "odd", "plain"],
        ["compare", "--json", "odd", "plain"],
        ["compare", "big", "plain"],
        ["compare", "--json", "big", "plain"],
        ["diff", "big", "plain"],
        ["report", "big"],
    ],
)
def test_odd_but_legal_values_get_an_answer_and_nothing_raw_reaches_the_terminal(
    odd_bundles: dict[str, str], args: list[str]
) -> None:
    argv = [odd_bundles.get(a, a) for a in args]
    res = CliRunner().invoke(main, argv)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    assert "internal error" not in res.output
    assert res.exit_code in (0, 3, 5, 6)
    for raw in ("\x1b", "\x00", "\x07", "\u202e", "\ud800"):
        assert raw not in res.output, (args, raw)
