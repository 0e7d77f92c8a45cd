"""Small defects of issue 10, one regression test each (CLI level)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kk3evidence import analyze
from kk3evidence.cli import main

REAL = Path(__file__).resolve().parents[1] / "data" / "realruns"


@pytest.mark.parametrize("args", [
    ["analyze", "{d}"], ["validate", "{d}"], ["check", "{d}"], ["report", "{d}"],
    ["diff", "{d}", "{d}"], ["compare", "{d}"],
])
def test_a_directory_given_as_a_bundle_is_invalid_input_everywhere(
        tmp_path: Path, args: list[str]) -> None:
    res = CliRunner().invoke(main, [a.format(d=tmp_path) for a in args])
    assert res.exit_code == 4, res.output
    assert "directory" in res.output


def test_analyze_takes_log_text_as_text_not_as_a_path() -> None:
    text = (REAL / "fail_port_in_use" / "output.log").read_text()
    result = analyze(text)
    assert result.source == "<text>"
    assert result.first_failure is not None and result.first_failure.category == "port"


def test_an_empty_log_is_not_no_failure(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    res = CliRunner().invoke(main, ["analyze", str(empty)])
    assert res.exit_code == 4
    assert "empty" in res.output
    assert "No failure found" not in res.output


def test_capture_refuses_to_overwrite_a_bundle(tmp_path: Path) -> None:
    out = tmp_path / "b.tar"
    out.write_bytes(b"earlier evidence")
    res = CliRunner().invoke(main, ["capture", "-o", str(out), "--", "true"])
    assert res.exit_code == 2
    assert "already exists" in res.output and "never overwritten" in res.output
    assert out.read_bytes() == b"earlier evidence"


def test_a_specific_rule_beats_the_generic_pydantic_wrapper() -> None:
    # real vLLM 0.32: "ValidationError: 1 validation error for ModelConfig" on line 52, the
    # specific "User-specified max_model_len (1000000) is greater than ..." on line 53
    # (the corpus keeps line 52 as the first causal line: the exception starts there)
    result = analyze(REAL / "fail_max_model_len_too_large" / "output.log")
    assert result.first_failure is not None
    assert result.first_failure.line_no == 52
    assert result.first_failure.rule == "CFG004"  # max-model-len-exceeds-derived, not CFG001
    assert [f.rule for f in result.findings if f.kind == "failure"] == ["CFG004"]
    assert any("classified by the specific CFG004" in n for n in result.extra.notes)
    res = CliRunner().invoke(main, ["analyze", str(REAL / "fail_max_model_len_too_large" /
                                                    "output.log")])
    assert "rule CFG004 (max-model-len-exceeds-derived)" in res.output


def test_the_estimated_maximum_model_length_is_shown_in_full() -> None:
    res = CliRunner().invoke(main, ["analyze", str(REAL / "fail_kv_cache_too_small" /
                                                    "output.log")])
    assert res.exit_code == 3
    assert "the estimated maximum model length is 896. Try increasing" in res.output
    assert "estimated maximum model length: 896 (line 74)" in res.output


def test_check_names_a_cpu_build_and_prints_readable_markers(tmp_path: Path) -> None:
    from _handoff_fixtures import gpu_fingerprint, run, write

    cpu = write(run("cpu"), tmp_path / "cpu.tar")
    res = CliRunner().invoke(main, ["check", str(cpu)])
    assert res.exit_code == 6
    assert "CPU build: fingerprint python.torch_version: 2.13.0+cpu" in res.output
    assert "????" not in res.output
    k3 = ["vllm", "serve", "moonshotai/Kimi-K3", "--tensor-parallel-size", "8",
          "--trust-remote-code"]  # no --gpu-memory-utilization 0.95: a warning-level rule
    gpu = write(run("k3", argv=k3, fingerprint=gpu_fingerprint()), tmp_path / "k3.tar")
    res = CliRunner().invoke(main, ["check", str(gpu), "--recipe", "kimi-k3"])
    assert "WARN    K3-006" in res.output  # a failed warning is not printed as FAIL
    assert "FAIL    K3-006" not in res.output
