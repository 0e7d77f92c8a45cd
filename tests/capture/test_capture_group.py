"""Which group a capture joins (capture/group.py): vLLM flags, Slurm, LeaderWorkerSet, Ray,
``--group``; clock evidence; the manifest's ``group`` written by a real capture and kept by seal.

The scheduler variable sets are the ones their documentation names: Slurm's sbatch/srun
"OUTPUT ENVIRONMENT VARIABLES" (values as on a 2-node ``srun --ntasks-per-node=1`` step) and
LeaderWorkerSet's pod webhook (``LWS_LEADER_ADDRESS = <leader pod>.<lws name>.<namespace>``,
``LWS_GROUP_SIZE``, ``LWS_WORKER_INDEX``; kubernetes-sigs/lws ``pkg/webhooks/pod_webhook.go``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kk3evidence.bundle.archive import BundleWriter, open_bundle, seal, validate
from kk3evidence.capture import group
from kk3evidence.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
PRINTER = REPO / "tests" / "progs" / "printer.py"
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

VLLM = [
    "vllm",
    "serve",
    "/models/tiny",
    "--tensor-parallel-size",
    "2",
    "--nnodes",
    "2",
    "--master-addr",
    "10.0.0.5",
    "--master-port",
    "29650",
]

# a 2-node `srun --ntasks-per-node=1` step of job 4242, as seen on its second node
SLURM_NODE1 = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOBID": "4242",
    "SLURM_JOB_NAME": "kimi-k3",
    "SLURM_JOB_NODELIST": "gpu[017-018]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_NODELIST": "gpu[017-018]",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURMD_NODENAME": "gpu018",
    "SLURM_SUBMIT_DIR": "/home/user",
    "SLURM_CLUSTER_NAME": "cluster",
}

# LeaderWorkerSet "vllm" in namespace "default", group 0 of size 2: the leader and a worker
LWS_LEADER = {
    "LWS_LEADER_ADDRESS": "vllm-0.vllm.default",
    "LWS_GROUP_SIZE": "2",
    "LWS_WORKER_INDEX": "0",
    "HOSTNAME": "vllm-0",
}
LWS_WORKER = {**LWS_LEADER, "LWS_WORKER_INDEX": "1", "HOSTNAME": "vllm-0-1"}


def test_vllm_flags_give_the_same_id_on_head_and_headless_worker() -> None:
    head = group.resolve(None, [*VLLM, "--node-rank", "0"], {}, clock={})
    worker = group.resolve(None, [*VLLM, "--node-rank", "1", "--headless"], {}, clock={})
    assert head is not None and worker is not None
    assert head.group_id == worker.group_id == "vllm-10.0.0.5-29650"
    assert (head.node_rank, head.nnodes, head.role) == (0, 2, "head")
    assert (worker.node_rank, worker.nnodes, worker.role) == (1, 2, "worker")


def test_data_parallel_flags_give_node_rank_from_start_rank() -> None:
    argv = [
        "vllm",
        "serve",
        "m",
        "--data-parallel-size",
        "16",
        "--data-parallel-size-local",
        "8",
        "--data-parallel-start-rank",
        "8",
        "--data-parallel-address",
        "10.0.0.5",
        "--data-parallel-rpc-port",
        "13345",
        "--headless",
    ]
    info = group.resolve(None, argv, {}, clock={})
    assert info is not None
    assert (info.group_id, info.node_rank, info.nnodes, info.source) == (
        "vllm-dp-10.0.0.5-13345",
        1,
        2,
        "vllm-dp",
    )


def test_slurm_documented_variables() -> None:
    info = group.resolve(None, ["python", "serve.py"], SLURM_NODE1, clock={})
    assert info is not None
    assert (info.group_id, info.node_rank, info.nnodes, info.source) == (
        "slurm-4242",
        1,
        2,
        "slurm",
    )
    assert info.detail["slurm.SLURMD_NODENAME"] == "gpu018"


def test_single_node_slurm_job_is_no_group_unless_asked() -> None:
    one = {**SLURM_NODE1, "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0"}
    assert group.resolve(None, ["x"], one, clock={}) is None
    asked = group.resolve("auto", ["x"], one, clock={})
    assert asked is not None and asked.group_id == "slurm-4242"


def test_lws_leader_and_worker_share_the_group() -> None:
    lead = group.resolve(None, ["x"], LWS_LEADER, clock={})
    work = group.resolve(None, ["x"], LWS_WORKER, clock={})
    assert lead is not None and work is not None
    assert lead.group_id == work.group_id == "lws-vllm-0"
    assert (lead.node_rank, lead.role, work.node_rank, work.role) == (0, "head", 1, "worker")
    assert work.detail["lws.pod"] == "vllm-0-1"


def test_ray_address_names_the_group_and_slurm_fills_the_rank() -> None:
    env = {"RAY_ADDRESS": "10.0.0.5:6379", **SLURM_NODE1}
    info = group.resolve("auto", ["x"], env, clock={})
    assert info is not None
    # Slurm comes before Ray: the job is the group; Ray's address is kept as detail
    assert info.group_id == "slurm-4242"
    assert info.detail["ray.ray_address"] == "10.0.0.5:6379"
    ray_only = group.resolve("auto", ["x"], {"RAY_ADDRESS": "ray://10.0.0.5:10001"}, clock={})
    assert ray_only is not None and ray_only.group_id == "ray-10.0.0.5-10001"


def test_explicit_group_wins_and_keeps_what_was_derived() -> None:
    info = group.resolve("run-7", [*VLLM, "--node-rank", "1"], {}, clock={})
    assert info is not None
    assert (info.group_id, info.source, info.node_rank) == ("run-7", "flag", 1)
    assert info.detail["derived_id"] == "vllm-10.0.0.5-29650"


@pytest.mark.parametrize("bad", ["", "-x", "a/b", "x" * 129, "a b"])
def test_bad_group_id_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError, match="--group"):
        group.resolve(bad, ["x"], {}, clock={})


def test_auto_with_nothing_to_derive_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="nothing to derive"):
        group.resolve("auto", ["python", "x.py"], {}, clock={})


@given(st.text(max_size=300))
def test_sanitized_ids_always_match_the_id_grammar(raw: str) -> None:
    assert ID_RE.match(group.sanitize_id(raw))


# chrony 4.x `chronyc -n tracking` and systemd 252 `timedatectl timesync-status` output
CHRONY = """Reference ID    : A9FEA97B (169.254.169.123)
Stratum         : 4
Ref time (UTC)  : Tue Dec 01 03:10:11 2026
System time     : 0.000012077 seconds slow of NTP time
Last offset     : -0.000004112 seconds
RMS offset      : 0.000010303 seconds
"""
TIMESYNCD = """       Server: 185.125.190.56 (ntp.ubuntu.com)
Poll interval: 34min 8s (min: 32s; max 34min 8s)
         Leap: normal
      Version: 4
      Stratum: 2
       Offset: -1.207ms
        Delay: 20.114ms
"""


def test_ntp_offsets_are_parsed_from_real_output() -> None:
    assert group.parse_chrony(CHRONY) == pytest.approx(-0.000012077)
    assert group.parse_chrony(CHRONY.replace("slow", "fast")) == pytest.approx(0.000012077)
    assert group.parse_timesyncd(TIMESYNCD) == pytest.approx(-0.001207)


@given(st.text(max_size=500))
def test_ntp_parsers_never_crash(text: str) -> None:
    group.parse_chrony(text)
    group.parse_timesyncd(text)


def test_clock_evidence_has_a_pair_and_says_why_ntp_is_missing() -> None:
    ev = group.clock_evidence()
    (sample,) = ev["samples"]
    assert sample["at"] == "start" and sample["read_ns"] >= 0
    ntp = ev["ntp"]
    assert (ntp["offset_s"] is None) == (ntp["source"] is None)
    if ntp["offset_s"] is None:
        assert ntp["error"]


def test_real_capture_with_group_writes_the_manifest_group(tmp_path: Path) -> None:
    bundle = tmp_path / "n1.tar"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kk3evidence",
            "capture",
            "-o",
            str(bundle),
            "--group",
            "g-1",
            "--no-probe",
            "--",
            sys.executable,
            str(PRINTER),
            "--lines",
            "3",
        ],
        capture_output=True,
        check=False,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **SLURM_NODE1},
    )
    assert proc.returncode == 0, proc.stderr
    assert validate(bundle) == []
    with open_bundle(bundle) as b:
        g = b.group
    assert g is not None
    assert (g["id"], g["node_rank"], g["nnodes"], g["source"]) == ("g-1", 1, 2, "flag")
    assert [s["at"] for s in g["clock"]["samples"]] == ["start", "end"]


def test_seal_keeps_the_group_of_a_capture_that_died(tmp_path: Path) -> None:
    staging = tmp_path / "st"
    w = BundleWriter(staging)
    w.set_group({"id": "g", "node_rank": 0, "nnodes": 2, "host": "h"})
    w.write_json("launch.json", json.loads(json.dumps(_launch())))
    out = seal(staging, tmp_path / "sealed.tar")
    with open_bundle(out) as b:
        assert b.group == {"id": "g", "node_rank": 0, "nnodes": 2, "host": "h"}


def test_bundle_without_group_stays_valid_and_has_no_group(tmp_path: Path) -> None:
    w = BundleWriter(tmp_path / "st")
    out = w.finalize(tmp_path / "b.tar")
    with tarfile.open(out) as tf:
        names = tf.getnames()
    assert any(n.endswith("manifest.json") for n in names)
    with open_bundle(out) as b:
        assert b.group is None


def _launch() -> dict[str, object]:
    return {
        "schema": "kk3evidence/launch/v1",
        "argv": ["x"],
        "cwd": "/",
        "pid": None,
        "started_at": "2026-12-01T00:00:00+00:00",
        "ended_at": None,
        "exit_code": None,
        "signal": None,
        "exit_status": None,
        "ready_seconds": None,
        "api": None,
        "served_model": None,
        "stages_reached": [],
        "interrupted_by": None,
    }
