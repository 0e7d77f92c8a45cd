"""Real two-node CPU starts of vLLM on one host, each node under ``kk3evidence capture --group``
(node 0 ``--nnodes 2 --node-rank 0``, node 1 ``--node-rank 1 --headless``), read back as one
group. The same runs, recorded once, are the fast tests' fixtures (tests/data/realruns/group_*).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kk3evidence.analysis import group
from kk3evidence.bundle.archive import open_bundle

sys.path.insert(0, str(Path(__file__).resolve().parent))
import twonode

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def _run(vllm_cpu: object, tmp_path: Path, scenario: str) -> twonode.GroupRun:
    return twonode.run_group(str(vllm_cpu.vllm), str(vllm_cpu.model), tmp_path, scenario)  # type: ignore[attr-defined]


def _analyze_cli(paths: list[Path]) -> tuple[int, dict[str, object]]:
    proc = subprocess.run(
        [sys.executable, "-m", "kk3evidence", "analyze", "--json", *map(str, paths)],
        capture_output=True,
        check=False,
    )
    return proc.returncode, json.loads(proc.stdout)


def test_healthy_two_node_start_is_a_clean_group(vllm_cpu: object, tmp_path: Path) -> None:
    run = _run(vllm_cpu, tmp_path, "healthy")
    assert run.rc0 == 0, run.out0[-2000:]
    for i, bundle in enumerate((run.node0, run.node1)):
        with open_bundle(bundle) as b:
            assert b.group is not None
            assert (b.group["id"], b.group["node_rank"], b.group["nnodes"]) == ("twonode", i, 2)
    rc, out = _analyze_cli([run.node0, run.node1])
    assert rc == 0 and out["first_failure"] is None
    timeline = out["group"]["timeline"]  # type: ignore[index]
    assert {e["node"] for e in timeline} == {"node0", "node1"}
    assert out["group"]["consistency"] == []  # type: ignore[index]


def test_node1_killed_during_start_is_named(vllm_cpu: object, tmp_path: Path) -> None:
    run = _run(vllm_cpu, tmp_path, "killed")
    assert run.rc1 == 128 + 9
    rc, out = _analyze_cli([run.node0, run.node1])
    assert rc == 3
    ff = out["first_failure"]
    assert ff["node"] == "node1"  # type: ignore[index]
    assert out["consequences"] and all(c["node"] == "node0" for c in out["consequences"])  # type: ignore[union-attr]


def test_node1_with_another_vllm_variable_is_named(vllm_cpu: object, tmp_path: Path) -> None:
    run = _run(vllm_cpu, tmp_path, "env")
    g = group.analyze_group([str(run.node0), str(run.node1)])
    name = twonode.ENV_EXTRA[0]
    (diff,) = [d for d in g.consistency if d["what"] == f"env.{name}"]
    assert diff["values"]["node1"] == twonode.ENV_EXTRA[1]
    assert diff["message"].startswith(f"node1 has {name}=")


def test_node1_with_another_dtype_fails_and_is_named(vllm_cpu: object, tmp_path: Path) -> None:
    run = twonode.run_group(str(vllm_cpu.vllm), str(vllm_cpu.model), tmp_path, "dtype", 300)  # type: ignore[attr-defined]
    g = group.analyze_group([str(run.node0), str(run.node1)])
    assert [d["what"] for d in g.consistency] == ["argv.dtype"]
    assert g.first_failure is not None and g.first_failure.node == "node1"
