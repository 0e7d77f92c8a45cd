"""compare: runs side by side, stability across repeats, and the guide's decision."""

from __future__ import annotations

import copy
import csv
import io
import json
from dataclasses import replace
from pathlib import Path

from _handoff_fixtures import gpu_fingerprint, run, write
from click.testing import CliRunner

from kk3evidence.cli import main
from kk3evidence.handoff.compare import compare

K3 = ["vllm", "serve", "moonshotai/Kimi-K3", "--tensor-parallel-size", "8",
      "--trust-remote-code", "--gpu-memory-utilization", "0.95"]


def k3(name: str, *, failed: bool = True, **fp: object):  # type: ignore[no-untyped-def]
    return run(name, argv=K3, fingerprint=gpu_fingerprint(**fp), failed=failed)  # type: ignore[arg-type]


def test_stable_failure_in_a_pinned_quiet_cluster_keeps_fixing_here() -> None:
    result = compare([k3("r1.tar"), k3("r2.tar"), k3("r3.tar")])
    (group,) = result.groups
    assert group.stability == "stable"
    assert result.decision.action == "keep_fixing_here"
    assert any("r1.tar, r2.tar, r3.tar" in e for e in result.decision.evidence)


def test_failure_point_varying_within_boundaries_moves_to_isolated() -> None:
    result = compare([k3("r1.tar"), k3("r2.tar", failed=False), k3("r3.tar")])
    assert result.groups[0].stability == "varies"
    assert result.decision.action == "move_to_isolated"
    assert any(r.startswith("(1)") for r in result.decision.reasons)


def test_varying_failure_outside_boundaries_means_fix_the_boundary_first() -> None:
    runs = [k3("r1.tar", driver="575.57.08"), k3("r2.tar", driver="575.57.08", failed=False)]
    result = compare(runs)
    assert result.runs["within_boundaries"].to_list() == ["no", "no"]
    assert result.decision.action == "keep_fixing_here"
    assert "official compatibility boundaries" in " ".join(result.decision.reasons)


def test_fingerprint_drift_within_a_group_moves_to_isolated() -> None:
    result = compare([k3("r1.tar", driver="580.82.07"), k3("r2.tar", driver="580.95.05")])
    assert result.decision.action == "move_to_isolated"
    assert any(r.startswith("(2)") for r in result.decision.reasons)
    assert any("driver varies: 580.82.07, 580.95.05" in e for e in result.decision.evidence)


def test_other_jobs_on_the_gpus_move_to_isolated() -> None:
    result = compare([k3("r1.tar", other_jobs=2), k3("r2.tar", other_jobs=2)])
    assert result.decision.action == "move_to_isolated"
    assert any(r.startswith("(3)") for r in result.decision.reasons)
    assert any("python3 train.py" in e for e in result.decision.evidence)


def _nccl(ev):  # type: ignore[no-untyped-def]
    """The same run failing in NCCL (not the user's own configuration)."""
    analysis = copy.deepcopy(dict(ev.analysis))
    analysis["first_failure"].update(stage="comm_group", category="nccl", rule="NCCL001")
    return replace(ev, analysis=analysis)


def test_same_failure_on_a_different_isolated_host_hands_off_upstream() -> None:
    runs = [_nccl(k3("cluster1.tar", other_jobs=1)), _nccl(k3("cluster2.tar", other_jobs=1)),
            _nccl(k3("iso1.tar", hostname="iso-node-01"))]
    result = compare(runs, isolated=["iso1.tar"])
    assert result.decision.action == "hand_off_upstream"
    assert "comm_group/nccl/NCCL001" in result.decision.reasons[0]
    assert "different, isolated host" in result.decision.reasons[0]
    envs = dict(zip(result.runs["run"].to_list(), result.runs["environment"].to_list(),
                    strict=True))
    assert envs == {"cluster1.tar": "original", "cluster2.tar": "original",
                    "iso1.tar": "isolated"}


def test_an_isolated_run_from_the_same_host_is_not_a_reproduction_elsewhere() -> None:
    runs = [_nccl(k3("c1.tar")), _nccl(k3("c2.tar")), _nccl(k3("iso1.tar"))]
    result = compare(runs, isolated=["iso1.tar"])
    assert result.decision.action == "keep_fixing_here"
    assert "not on a different host" in result.decision.reasons[0]


def test_the_users_own_configuration_error_is_never_handed_off_upstream() -> None:
    # WGT001 (weights) reproduces on another, isolated host: still the user's weights.
    runs = [k3("c1.tar"), k3("c2.tar"), k3("iso1.tar", hostname="iso-node-01")]
    result = compare(runs, isolated=["iso1.tar"])
    assert result.decision.action == "keep_fixing_here"
    assert "weights failure" in result.decision.reasons[0]


def test_recorded_cluster_notes_count_as_other_jobs() -> None:
    notes = {"schema": "kk3evidence/notes/v1", "notes": [], "changes": [],
             "cluster": {"gpu_processes": [], "text": "shared node, 3 other training jobs"}}
    runs = [run(n, argv=K3, fingerprint=gpu_fingerprint(), failed=True, notes=notes)
            for n in ("r1.tar", "r2.tar")]
    result = compare(runs)
    assert result.decision.action == "move_to_isolated"
    assert any(r.startswith("(3)") for r in result.decision.reasons)
    assert any("3 other training jobs" in e for e in result.decision.evidence)
    quiet = {"schema": "kk3evidence/notes/v1", "notes": ["no other jobs"], "changes": [],
             "cluster": None}
    runs = [run(n, argv=K3, fingerprint=gpu_fingerprint(), failed=True, notes=quiet)
            for n in ("r1.tar", "r2.tar")]
    assert compare(runs).decision.action == "keep_fixing_here"


def test_no_nvml_means_occupancy_unknown_not_quiet() -> None:
    # NVML failed: nobody saw the GPU processes, so nobody saw the GPUs empty.
    fp = gpu_fingerprint()
    fp["gpus"] = {"source": "error", "error": "NVML Shared Library Not Found", "devices": []}
    runs = [run(n, argv=K3, fingerprint=copy.deepcopy(fp), failed=True)
            for n in ("r1.tar", "r2.tar")]
    result = compare(runs)
    assert result.runs["other_gpu_processes"].to_list() == [None, None]
    reason = result.decision.reasons[-1]
    assert "no other jobs" not in reason
    assert "occupancy unknown" in reason


def test_outside_the_boundary_is_stated_as_a_reason() -> None:
    runs = [k3("r1.tar", driver="575.57.08"), k3("r2.tar", driver="575.57.08")]
    result = compare(runs)
    assert result.decision.action == "keep_fixing_here"
    assert any("outside the official compatibility boundaries" in r
               for r in result.decision.reasons)


def test_isolated_environment_from_notes_and_host() -> None:
    notes = {"schema": "kk3evidence/notes/v1", "notes": ["environment: isolated"],
             "changes": [], "cluster": {"gpu_processes": [], "text": None}}
    iso = run("iso.tar", argv=K3, fingerprint=gpu_fingerprint(), failed=True, notes=notes)
    result = compare([k3("c.tar"), iso])
    assert result.runs["environment"].to_list() == ["original", "isolated"]
    by_host = compare([k3("c.tar")], isolated_hosts=["gpu-node-07"])
    assert by_host.runs["environment"].to_list() == ["isolated"]


def test_clean_in_isolated_but_failing_here_keeps_fixing_the_cluster() -> None:
    result = compare([k3("c1.tar"), k3("c2.tar"), k3("iso.tar", failed=False)],
                     isolated=["iso.tar"])
    assert result.decision.action == "keep_fixing_here"
    assert "isolated environment but fails on the original cluster" in (
        result.decision.reasons[0])


def test_a_failed_start_joins_the_group_of_the_same_command_with_a_request() -> None:
    result = compare([k3("ok.tar", failed=False), k3("fail.tar")])
    assert len(set(result.runs["config"].to_list())) == 1


def test_different_flags_are_different_groups() -> None:
    other = run("b.tar", argv=[*K3, "--max-num-seqs", "8"], fingerprint=gpu_fingerprint(),
                failed=True)
    result = compare([k3("a.tar"), other])
    assert result.runs["config"].to_list() == ["C1", "C2"]
    assert result.decision.action == "keep_fixing_here"
    assert "no repeated configuration" in result.decision.reasons[0]


def test_cli_table_json_and_csv(tmp_path: Path) -> None:
    a = write(k3("a"), tmp_path / "a.tar")
    b = write(k3("b"), tmp_path / "b.tar", with_analysis=False)
    iso = write(k3("iso", hostname="iso-node-01"), tmp_path / "iso.tar")
    runner = CliRunner()
    human = runner.invoke(main, ["compare", str(a), str(b), "--isolated", str(iso)])
    assert human.exit_code == 0, human.output
    # a weights failure is the user's own: never "hand off upstream"
    assert "Decision: keep fixing here" in human.output
    doc = json.loads(runner.invoke(main, ["compare", str(a), str(b), "--json"]).output)
    assert doc["schema"] == "kk3evidence/compare/v1"
    assert [r["run"] for r in doc["runs"]] == ["a.tar", "b.tar"]
    assert doc["groups"][0]["stability"] == "stable"
    out = runner.invoke(main, ["compare", str(a), str(b), "--csv"]).output
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["signature"] for r in rows] == ["weights_access/weights/WGT001"] * 2
    assert runner.invoke(main, ["compare", str(a), "--json", "--csv"]).exit_code == 2
    assert runner.invoke(main, ["compare"]).exit_code == 2
