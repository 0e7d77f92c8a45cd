"""report --format snippet: at most 40 lines to paste into an issue."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from _handoff_fixtures import BASE_ARGV, run, write
from click.testing import CliRunner

from kk3evidence.cli import main
from kk3evidence.handoff.report.snippet import MAX_LINES, render_snippet


def test_snippet_of_a_failed_run_has_every_essential_in_40_lines(tmp_path: Path) -> None:
    failed = write(
        run("fail", argv=[*BASE_ARGV, "--enable-prefix-caching"], failed=True),
        tmp_path / "fail.tar",
        with_analysis=False,
    )
    r = CliRunner().invoke(main, ["report", str(failed), "--format", "snippet"])
    assert r.exit_code == 0, r.output
    text = r.output
    assert len(text.splitlines()) <= MAX_LINES
    # the first causal line, found by the real analyzer, with its neighbours
    assert re.search(r">>\s+5\s+\(Worker pid=15700\) ERROR .*Cannot find any model weights", text)
    assert "stage `weights_access`" in text and "category `weights`" in text
    assert "basis `rule`" in text
    assert "vLLM 0.32.0" in text
    assert "Minimal command (3 flags dropped):" in text
    assert "--enable-prefix-caching" not in text.split("Minimal command")[1]
    sha = hashlib.sha256(failed.read_bytes()).hexdigest()
    assert f"sha256 `{sha}`" in text


def test_snippet_of_a_healthy_run_says_no_failure(tmp_path: Path) -> None:
    ok = write(run("base"), tmp_path / "ok.tar")
    r = CliRunner().invoke(main, ["report", str(ok), "--format", "snippet"])
    assert r.exit_code == 0, r.output
    assert "No failure found" in r.output and len(r.output.splitlines()) <= MAX_LINES


def test_snippet_stays_within_40_lines_with_huge_lines() -> None:
    ev = run("fail", failed=True)
    text = render_snippet(ev)
    assert len(text.splitlines()) <= MAX_LINES
    assert all(len(line) < 700 for line in text.splitlines())
