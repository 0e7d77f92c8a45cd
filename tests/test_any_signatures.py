"""scripts/any-signatures: public signatures naming Any are found; the package has none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "any-signatures"


def _run(*targets: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, targets)],
                          capture_output=True, text=True, check=False)


PACKAGE = REPO / "kk3evidence"


def _package_parts() -> list[Path]:
    """Every sub-package folder and every top-level module, named one by one so that a new
    folder is checked as soon as it exists."""
    folders = sorted(p for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    return [*folders, *sorted(PACKAGE.glob("*.py"))]


def test_no_public_signature_in_the_package_uses_any() -> None:
    parts = _package_parts()
    assert {"analysis", "bundle", "capture", "cli", "handoff"} <= {p.name for p in parts}
    assert {"model.py", "vllm_args.py", "errors.py"} <= {p.name for p in parts}
    covered = {f for p in parts for f in ([p] if p.is_file() else p.rglob("*.py"))}
    assert covered == set(PACKAGE.rglob("*.py"))
    r = _run(*parts)
    assert r.returncode == 0, r.stdout


def test_the_whole_package_by_default_has_none() -> None:
    r = _run()
    assert r.returncode == 0, r.stdout
    assert "0 public signature(s) with Any" in r.stderr


def test_public_functions_and_methods_naming_any_are_reported(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import Any\nimport typing\n"
        "def a(x: dict[str, Any]) -> None: ...\n"
        "def b() -> 'list[Any]': ...\n"
        "def c(*args: typing.Any) -> None: ...\n"
        "def _private(x: Any) -> None: ...\n"
        "def fine(x: object) -> dict[str, int]: ...\n"
        "class K:\n    def m(self, y: Any = None) -> None: ...\n"
        "    def _p(self, y: Any) -> None: ...\n"
        "class _Hidden:\n    def m(self, y: Any) -> None: ...\n"
        "def outer() -> None:\n    def inner(z: Any) -> None: ...\n",
        encoding="utf-8")
    r = _run(src)
    assert r.returncode == 1
    names = [line.split()[1] for line in r.stdout.splitlines()]
    assert names == ["a", "b", "c", "K.m"]


def test_a_missing_target_is_a_usage_error(tmp_path: Path) -> None:
    r = _run(tmp_path / "nope")
    assert r.returncode == 2 and "no such file" in r.stderr
