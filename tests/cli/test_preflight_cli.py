"""`kk3evidence preflight`: exit codes 0 / 6 / 2, fails first with what to do, --json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from click.testing import CliRunner
from progs.helpers import free_port

from kk3evidence.cli import main


def fake_vllm(tmp_path: Path) -> Path:
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\nraise SystemExit(1)\n")
    script.chmod(0o755)
    return script


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["preflight", *args],
                                env={"PATH": os.environ.get("PATH", "")})
    return result.exit_code, result.output


def test_no_command_is_a_usage_error() -> None:
    code, out = invoke()
    assert code == 2 and "vllm serve" in out


def test_a_command_that_is_not_vllm_serve_is_a_usage_error() -> None:
    code, out = invoke("--", "python", "-c", "pass")
    assert code == 2 and "not" in out


def test_unknown_recipe_is_a_usage_error(tmp_path: Path) -> None:
    code, out = invoke("--recipe", "nope", "--", str(fake_vllm(tmp_path)), "serve", "m")
    assert code == 2 and "unknown recipe" in out


def test_a_failing_check_exits_6_and_is_listed_first_with_what_to_do(tmp_path: Path) -> None:
    vllm = fake_vllm(tmp_path)
    code, out = invoke("--", str(vllm), "serve", str(tmp_path / "missing"), "--port",
                       str(free_port()), "--tensor-parallel-size", "3", "--bogus-flag")
    assert code == 6
    body = [line for line in out.splitlines() if line[:4] in ("PASS", "FAIL", "WARN", "????")]
    assert body[0].startswith("FAIL")
    first_pass = next(i for i, line in enumerate(body) if line.startswith("PASS"))
    assert all(not line.startswith("FAIL") for line in body[first_pass:])
    assert "do: " in out and "flags.unknown" in out


def test_json_output_is_one_object_with_every_check(tmp_path: Path) -> None:
    vllm = fake_vllm(tmp_path)
    code, out = invoke("--json", "--", str(vllm), "serve", str(tmp_path / "missing"),
                       "--port", str(free_port()))
    doc = json.loads(out)
    assert code == 6 and doc["schema"] == "kk3evidence/preflight/v1" and not doc["ok"]
    assert {c["status"] for c in doc["checks"]} <= {"pass", "fail", "warn", "unknown"}
