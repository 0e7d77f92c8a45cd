from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from kk3evidence import __version__
from kk3evidence.cli import main


def test_version_prints_package_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.output


def test_help_shows_examples_and_exit_codes() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "Examples:" in result.output
    assert "kk3evidence capture -o run1.tar" in result.output
    assert "Exit codes" in result.output


def test_unknown_command_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["no-such-command"])
    assert result.exit_code == 2


def test_console_script_runs_as_a_real_process() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kk3evidence", "--version"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert __version__ in proc.stdout
