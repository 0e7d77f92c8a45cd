"""`kk3evidence rules export`: the rule pack on stdout or in a file."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from kk3evidence.analysis.rulepack import export_pack
from kk3evidence.cli import main


def test_rules_export_prints_the_pack_as_json() -> None:
    r = CliRunner().invoke(main, ["rules", "export", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == export_pack()


def test_rules_export_writes_a_file(tmp_path: Path) -> None:
    out = tmp_path / "pack.json"
    r = CliRunner().invoke(main, ["rules", "export", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text(encoding="utf-8"))["schema"] == "kk3evidence/rule-pack/v1"


def test_rules_export_to_an_unwritable_place_is_a_clear_error(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["rules", "export", "-o", str(tmp_path / "no" / "pack.json")])
    assert r.exit_code == 2 and "cannot write the rule pack" in r.output
    assert "Traceback" not in r.output


def test_rules_export_rejects_an_unknown_format() -> None:
    r = CliRunner().invoke(main, ["rules", "export", "--format", "yaml"])
    assert r.exit_code == 2
