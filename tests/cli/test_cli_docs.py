from __future__ import annotations

from pathlib import Path

from kk3evidence.cli._docgen import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_cli_reference_is_current() -> None:
    assert DOC.exists(), "docs/cli.md missing: python -m kk3evidence.cli._docgen > docs/cli.md"
    assert DOC.read_text(encoding="utf-8") == render(), (
        "docs/cli.md is stale: regenerate with python -m kk3evidence.cli._docgen > docs/cli.md"
    )
