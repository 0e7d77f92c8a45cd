"""`kk3evidence validate` and `kk3evidence seal` as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

from bundle_factory import (
    build_tar,
    dumps,
    launch_doc,
    valid_files,
    valid_raw_members,
    write_bundle,
)
from click.testing import CliRunner

from kk3evidence.bundle.archive import BundleWriter, open_bundle
from kk3evidence.cli import main


def test_valid_bundle_exits_0(tmp_path: Path) -> None:
    out = write_bundle(tmp_path / "run.tar.gz")
    result = CliRunner().invoke(main, ["validate", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"{out}: valid kk3evidence bundle"


def test_valid_bundle_json(tmp_path: Path) -> None:
    out = write_bundle(tmp_path / "run.tar")
    result = CliRunner().invoke(main, ["validate", "--json", str(out)])
    assert result.exit_code == 0
    assert json.loads(result.output) == {"source": str(out), "valid": True, "problems": []}


def test_every_problem_is_one_line_with_member_path_expected_and_actual(tmp_path: Path) -> None:
    files = valid_files()
    files["launch.json"] = dumps(launch_doc(exit_code="boom", signal=0))
    path = build_tar(tmp_path / "bad.tar", valid_raw_members(files))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 4
    lines = result.output.strip().splitlines()
    assert lines[0] == (
        "launch.json $.exit_code: does not match the schema: 'boom' is not of type 'integer', "
        '\'null\' (expected ["integer", "null"], got string) [schema]'
    )
    assert lines[1].startswith("launch.json $.signal: ")
    assert "(expected minimum 1, got 0) [schema]" in lines[1]
    assert lines[-1].startswith(f"{path}: INVALID, 2 problems; most relevant: launch.json")


def test_json_output_lists_located_problems(tmp_path: Path) -> None:
    files = valid_files()
    files["launch.json"] = dumps(launch_doc(exit_code="boom"))
    path = build_tar(tmp_path / "bad.tar", valid_raw_members(files))
    result = CliRunner().invoke(main, ["validate", "--json", str(path)])
    assert result.exit_code == 4
    report = json.loads(result.output)
    assert report["valid"] is False
    assert report["problems"] == [
        {
            "code": "schema",
            "message": "does not match the schema: 'boom' is not of type 'integer', 'null'",
            "member": "launch.json",
            "json_path": "$.exit_code",
            "expected": '["integer", "null"]',
            "actual": "string",
        }
    ]


def test_usage_errors_exit_2() -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["validate"]).exit_code == 2
    assert runner.invoke(main, ["validate", "--nope", "x.tar"]).exit_code == 2
    assert runner.invoke(main, ["seal"]).exit_code == 2


def test_missing_file_exits_4_with_a_clear_message(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "nope.tar")])
    assert result.exit_code == 4
    assert "no such file" in result.output


def test_seal_cli_writes_a_valid_bundle_beside_the_staging_folder(tmp_path: Path) -> None:
    stg = tmp_path / "capture-staging"
    w = BundleWriter(stg)
    fp = w.open_stream("logs/combined.log")
    fp.write(b"INFO partial line")
    fp.close()  # the capture died; the kernel closed its files
    result = CliRunner().invoke(main, ["seal", str(stg)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "capture-staging.tar"
    assert result.output.strip() == f"sealed {stg} -> {out}"
    with open_bundle(out) as b:
        assert b.manifest["sealed_from_staging"] is True
    assert stg.exists()


def test_seal_cli_output_option_and_remove_staging(tmp_path: Path) -> None:
    stg = tmp_path / "stg"
    BundleWriter(stg)
    out = tmp_path / "x.tgz"
    result = CliRunner().invoke(main, ["seal", str(stg), "-o", str(out), "--remove-staging"])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:2] == b"\x1f\x8b"
    assert not stg.exists()


def test_seal_cli_refuses_what_is_not_a_staging_folder(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    for target in (tmp_path / "plain", tmp_path / "missing"):
        result = CliRunner().invoke(main, ["seal", str(target)])
        assert result.exit_code == 4
        assert "kk3evidence: error:" in result.output
        assert not (tmp_path / f"{target.name}.tar").exists()


def test_hostile_text_cannot_drive_the_terminal(tmp_path: Path) -> None:
    files = valid_files()
    files["notes.json"] = json.dumps(
        {"schema": "kk3evidence/notes/v1", "notes": "\u202eevil\x1b[2J", "changes": []}
    ).encode()
    path = build_tar(tmp_path / "bidi.tar", valid_raw_members(files))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 4
    assert "notes.json $.notes" in result.output
    assert "\u202e" not in result.output and "\x1b" not in result.output


def test_seal_default_output_follows_capture_naming(tmp_path: Path) -> None:
    stg = tmp_path / "run.tar.gz.staging"
    BundleWriter(stg)
    result = CliRunner().invoke(main, ["seal", str(stg)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run.tar.gz").read_bytes()[:2] == b"\x1f\x8b"
    # Never overwrite an existing bundle by default.
    again = CliRunner().invoke(main, ["seal", str(stg)])
    assert again.exit_code == 2
    assert "already exists" in again.output


def test_seal_cli_reports_a_damaged_marker_in_one_line(tmp_path: Path) -> None:
    stg = tmp_path / "stg"
    BundleWriter(stg)
    marker = stg / "staging.json"
    state = json.loads(marker.read_text())
    state["created"] = "not a time"
    marker.write_text(json.dumps(state))
    result = CliRunner().invoke(main, ["seal", str(stg), "-o", str(tmp_path / "o.tar")])
    assert result.exit_code == 4
    assert "damaged" in result.output and "Traceback" not in result.output
