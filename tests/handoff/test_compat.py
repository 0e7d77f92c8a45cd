"""check: official compatibility boundaries kept as data, pass / fail / unknown with evidence."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import jsonschema
import pytest
from _handoff_fixtures import gpu_fingerprint, run, write
from click.testing import CliRunner

from kk3evidence.cli import main
from kk3evidence.errors import UsageError
from kk3evidence.handoff.compat import _CHECKS, check, load_compat_rules, parse_version, recipes

REPO = Path(__file__).resolve().parents[2]
K3 = ["vllm", "serve", "moonshotai/Kimi-K3", "--tensor-parallel-size", "8",
      "--trust-remote-code", "--gpu-memory-utilization", "0.95"]


def k3_run(argv: list[str] | None = None, **fp: object):  # type: ignore[no-untyped-def]
    return run("k3.tar", argv=argv or K3, fingerprint=gpu_fingerprint(**fp))  # type: ignore[arg-type]


def failed_ids(result) -> set[str]:  # type: ignore[no-untyped-def]
    return {r.rule.id for r in result.failed}


def test_official_boundary_passes_every_rule() -> None:
    result = check(k3_run(), "kimi-k3")
    assert result.ok and result.exit_code == 0
    assert {r.status for r in result.results} == {"pass"}


def test_cu129_image_fails_with_reason() -> None:
    result = check(k3_run(image_ref="vllm/vllm-openai:v0.27.1-cu129", torch_cuda="12.9",
                          cuda_driver="13.0"), "kimi-k3")
    assert result.exit_code == 6
    (flavour,) = [r for r in result.results if r.rule.id == "K3-001"]
    assert flavour.status == "fail"
    assert "cu129" in flavour.reason
    assert any("torch_cuda: 12.9" in e for e in flavour.evidence)


def test_r575_driver_fails_with_reason() -> None:
    result = check(k3_run(driver="575.57.08", cuda_driver="12.9"), "kimi-k3")
    assert result.exit_code == 6
    assert {"K3-002", "CUDA-001", "CUDA-002"} <= failed_ids(result)
    (drv,) = [r for r in result.results if r.rule.id == "K3-002"]
    assert drv.reason == "driver branch r575 is older than r580"
    (floor,) = [r for r in result.results if r.rule.id == "CUDA-001"]
    assert "580.65.06" in floor.reason and "575.57.08" in floor.reason


def test_four_gpus_fail_with_reason() -> None:
    argv = [*K3]
    argv[argv.index("8")] = "4"
    result = check(k3_run(argv, n_gpus=4), "kimi-k3")
    assert result.exit_code == 6
    (gpus,) = [r for r in result.results if r.rule.id == "K3-004"]
    assert gpus.status == "fail"
    assert gpus.reason == "4 GPUs visible, single-node tensor parallel needs at least 8"


def test_cli_names_each_failed_reason(tmp_path: Path) -> None:
    argv = [*K3]
    argv[argv.index("8")] = "4"
    ev = run("bad", argv=argv, fingerprint=gpu_fingerprint(
        n_gpus=4, driver="575.57.08", cuda_driver="12.9", torch_cuda="12.9",
        image_ref="vllm/vllm-openai:v0.27.1-cu129"))
    path = write(ev, tmp_path / "bad.tar")
    result = CliRunner().invoke(main, ["check", str(path), "--recipe", "kimi-k3"])
    assert result.exit_code == 6, result.output
    for needle in ("K3-001", "cu129", "K3-002", "r575", "K3-004", "4 GPUs visible"):
        assert needle in result.output
    assert "source: https://github.com/vllm-project/recipes" in result.output


def test_cli_json_and_ok_exit(tmp_path: Path) -> None:
    path = write(k3_run(), tmp_path / "ok.tar")
    result = CliRunner().invoke(main, ["check", str(path), "--recipe", "kimi-k3", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["ok"] is True and doc["recipe"] == "kimi-k3"
    assert all(r["source"].startswith("https://") and r["source_date"] for r in doc["results"])


def test_h100_needs_32_gpus() -> None:
    result = check(k3_run(n_gpus=8, gpu_name="NVIDIA H100 80GB HBM3"), "kimi-k3")
    (gpus,) = [r for r in result.results if r.rule.id == "K3-004"]
    assert gpus.status == "fail" and "32" in gpus.reason


def test_pipeline_parallel_needs_16() -> None:
    argv = [*K3, "--pipeline-parallel-size", "2"]
    result = check(k3_run(argv, n_gpus=8), "kimi-k3")
    (gpus,) = [r for r in result.results if r.rule.id == "K3-004"]
    assert gpus.status == "fail" and "TP+PP" in gpus.reason and "16" in gpus.reason
    (par,) = [r for r in result.results if r.rule.id == "PAR-001"]
    assert par.status == "fail"  # 16 ranks on 8 GPUs, single node


def test_multi_node_parallel_is_unknown_not_fail() -> None:
    argv = [*K3, "--pipeline-parallel-size", "2", "--distributed-executor-backend", "ray"]
    result = check(k3_run(argv, n_gpus=8))
    (par,) = [r for r in result.results if r.rule.id == "PAR-001"]
    assert par.status == "unknown"


def test_recipe_warning_does_not_fail_the_check() -> None:
    argv = [a for a in K3 if a not in ("--gpu-memory-utilization", "0.95")]
    result = check(k3_run(argv), "kimi-k3")
    (gmu,) = [r for r in result.results if r.rule.id == "K3-006"]
    assert gmu.status == "fail" and gmu.rule.level == "warning"
    assert result.ok


def test_recipe_is_picked_from_the_served_model() -> None:
    result = check(k3_run())
    assert result.recipe == "kimi-k3" and result.recipe_auto


def test_cpu_build_is_decided_from_proof_not_left_unknown() -> None:
    # torch 2.13.0+cpu, vLLM 0.32.0+cpu and no NVML (the real CPU run's fingerprint): the
    # CUDA-driver rules are outside, not unknown; the parallelism rule agrees with the GPU
    # count on the same evidence.
    result = check(run("cpu"))
    assert result.recipe is None
    assert "unknown" not in {r.status for r in result.results}
    assert all("CPU build" in r.reason or r.status == "fail" for r in result.results)
    assert result.exit_code == 6


def test_cpu_build_fails_the_vllm_version_rule_and_the_cuda_image_rule() -> None:
    result = check(run("cpu", argv=K3), "kimi-k3")
    by_id = {r.rule.id: r for r in result.results}
    assert by_id["K3-003"].status == "fail" and "CPU build" in by_id["K3-003"].reason
    assert by_id["K3-001"].status == "fail" and "CPU build" in by_id["K3-001"].reason
    assert by_id["K3-002"].status == "fail"
    assert by_id["K3-004"].status == "fail"
    assert any("torch_version: 2.13.0+cpu" in e for e in by_id["K3-001"].evidence)


def test_unknown_recipe_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        check(run("cpu"), "no-such-recipe")
    path = write(run("cpu"), tmp_path / "cpu.tar")
    result = CliRunner().invoke(main, ["check", str(path), "--recipe", "nope"])
    assert result.exit_code == 2
    assert "kimi-k3" in result.output


def test_rule_files_follow_their_schema_with_source_and_date() -> None:
    schema = json.loads((REPO / "schemas" / "compat-rule.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    files = sorted((REPO / "rules" / "compat").glob("*.toml"))
    assert files
    for f in files:
        doc = tomllib.loads(f.read_text(encoding="utf-8"))
        jsonschema.validate(doc, schema)
    assert set(schema["properties"]["rule"]["items"]["properties"]["check"]["enum"]) == set(
        _CHECKS)
    rules = load_compat_rules()
    assert len({r.id for r in rules}) == len(rules)
    assert "kimi-k3" in recipes()


def test_spec_facts_are_encoded() -> None:
    rules = {r.id: r for r in load_compat_rules()}
    floors = rules["CUDA-001"].params["floors"]
    assert floors["13.0"] == "580.65.06" and floors["12.9"] == "575.51.03"
    assert rules["K3-003"].params["min"] == "0.27.1"
    assert rules["K3-002"].params["min_branch"] == 580
    assert rules["K3-007"].params == {"name": "VLLM_ENGINE_READY_TIMEOUT_S", "min": 3600,
                                      "default": 600}


@pytest.mark.parametrize(("text", "expected"), [
    ("0.32.0+cpu", (0, 32, 0)), ("580.65.06", (580, 65, 6)), ("v0.27.1rc1", (0, 27, 1)),
    (13000, (13, 0)), (12090, (12, 9)), ("13.0", (13, 0)), (None, None), ("abc", None),
])
def test_parse_version(text: object, expected: object) -> None:
    assert parse_version(text) == expected


def test_a_malformed_rule_file_is_a_one_line_rule_error() -> None:
    from kk3evidence.errors import RuleError
    from kk3evidence.handoff.compat import _parse_rule_file

    text = (REPO / "rules" / "compat" / "parallelism.toml").read_text(encoding="utf-8")
    with pytest.raises(RuleError) as err:
        _parse_rule_file("x.toml", text.replace('check = "parallel_fits_gpus"',
                                                'check = "no_such_check"'))
    assert "\n" not in str(err.value) and "x.toml" in str(err.value)
    with pytest.raises(RuleError):
        _parse_rule_file("y.toml", text.replace('source_date = "2026-08-20"',
                                                'source_date = "recently"'))
    with pytest.raises(RuleError):
        _parse_rule_file("z.toml", "schema = [")


def test_multiprocessing_backend_is_not_multi_node() -> None:
    argv = [*K3, "--pipeline-parallel-size", "2", "--distributed-executor-backend", "mp"]
    result = check(k3_run(argv, n_gpus=8))
    (par,) = [r for r in result.results if r.rule.id == "PAR-001"]
    assert par.status == "fail"
