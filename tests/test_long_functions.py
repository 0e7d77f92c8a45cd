"""scripts/long-functions: no function in the package is longer than 80 lines (STYLE.md, issue 9).

One case per package folder, so a failure names the layer to look at."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "long-functions"
PKG = REPO / "kk3evidence"

PACKAGES = [
    "capture",
    "cli",
    "analysis",
    "bundle",
    "handoff",
]


def _run(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, paths)],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_longer_than_80_lines(package: str) -> None:
    done = _run(PKG / package)
    assert done.returncode == 0, f"functions over 80 lines:\n{done.stdout}{done.stderr}"
    assert done.stdout == ""


def test_top_level_modules_have_no_long_function() -> None:
    done = _run(*sorted(PKG.glob("*.py")))
    assert done.returncode == 0, done.stdout


def _function(name: str, body_lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(body_lines))
    return f"{indent}def {name}():\n{body}"


def test_reports_functions_over_the_limit_with_their_place(tmp_path: Path) -> None:
    src = tmp_path / "mod.py"
    src.write_text(
        _function("ok", 79)  # 80 lines with its def: allowed
        + _function("too_long", 80)  # 81 lines
        + "class K:\n"
        + _function("method", 81, indent="    ")
        + "TABLE = [\n" + "".join(f"    {i},\n" for i in range(200)) + "]\n",  # data: not counted
        encoding="utf-8",
    )
    done = _run(tmp_path)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("mod.py:81: too_long (81 lines)")
    assert lines[1].endswith("mod.py:163: K.method (82 lines)")


def test_clean_folder_exits_zero(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(textwrap.dedent(_function("f", 10)), encoding="utf-8")
    done = _run(tmp_path)
    assert (done.returncode, done.stdout) == (0, "")
