"""The capture command through click's CliRunner (in-process)."""

from __future__ import annotations

import sys
from pathlib import Path

from click.testing import CliRunner

from kk3evidence.bundle.archive import open_bundle
from kk3evidence.cli import main


def test_help_names_the_main_options() -> None:
    result = CliRunner().invoke(main, ["capture", "--help"])
    assert result.exit_code == 0
    for opt in (
        "--output",
        "--note",
        "--change",
        "--ready-timeout",
        "--request",
        "--repeat",
        "--prefix-probe",
        "--stop-after-request",
        "--image",
        "--image-id",
    ):
        assert opt in result.output


def test_capture_in_process_passes_output_and_exit_code(tmp_path: Path) -> None:
    bundle = tmp_path / "b.tar"
    result = CliRunner().invoke(
        main,
        [
            "capture",
            "-o",
            str(bundle),
            "--no-analyze",
            "--",
            sys.executable,
            "-c",
            "import sys; print('hello'); sys.exit(5)",
        ],
    )
    assert result.exit_code == 5, result.output
    assert "hello\n" in result.stdout
    with open_bundle(bundle) as b:
        assert b.read_bytes("logs/combined.log") == b"hello\n"


def test_missing_command_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["capture"])
    assert result.exit_code == 2


def test_bad_request_file_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "req.json"
    bad.write_text("{not json")
    result = CliRunner().invoke(
        main, ["capture", "-o", str(tmp_path / "b.tar"), "--request", str(bad), "--", "true"]
    )
    assert result.exit_code == 4
    assert result.stderr.startswith("kk3evidence: error: --request")
    assert len(result.stderr.strip().splitlines()) == 1
