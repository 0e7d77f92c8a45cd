"""A real vLLM server that stops serving: its worker frozen in the middle of requests.

vLLM 0.32 (CPU build) is started under ``kk3evidence capture --stall-action stop``; four
completion requests are sent, and 0.7 s later the ``VLLM::Worker`` process is frozen with
SIGSTOP (what a hung GPU kernel or collective looks like from the engine core: it waits for the
worker's answer for ever). ``/health`` still answers. At the default INFO level vLLM prints one
stats line with the requests running at 0 tokens/s and then nothing (the later zero lines go to
DEBUG): the watchdog waits SILENT_S of silence, takes the two stall snapshots (the worker is in
state T, the engine core waits in ``collective_rpc``), stops the server, and the bundle's
analysis is the serving stall (STALL002).

Run as a script (``python tests/e2e/test_serving_stall_vllm.py OUTDIR [FIXTUREDIR]``) it
records the run and, with FIXTUREDIR, stores the bundle and its log with host paths rewritten
(``tests/data/realruns/serving_stall_sigstop_worker`` was made this way).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kk3evidence.capture.procscan import process_tree

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
REQUEST = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 480, "ignore_eos": True}


def _named(pids: list[int], name: str) -> int | None:
    for p in pids:
        try:
            with open(f"/proc/{p}/comm") as fh:
                if fh.read().strip().startswith(name):
                    return p
        except OSError:
            continue
    return None


def _post(port: int) -> None:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(REQUEST).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        urllib.request.urlopen(req, timeout=240).read()
    except OSError:
        pass  # the server is stopped under it: expected


def record(vllm: str, model: str, bundle: Path, port: int, env: dict[str, str]) -> dict[str, Any]:
    """Run the scenario; returns what happened (capture's exit status, the frozen pid)."""
    argv = [
        sys.executable, "-m", "kk3evidence", "capture", "-o", str(bundle), "--no-probe",
        "--stall-after", "600", "--stall-action", "stop", "--grace", "3", "--",
        vllm, "serve", model, "--served-model-name", "tiny", "--host", "127.0.0.1",
        "--port", str(port), "--max-model-len", "512", "--dtype", "float32",
        "--enforce-eager",  # conftest.FAST_START
    ]
    cap = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and cap.poll() is None:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                break
            except OSError:
                time.sleep(1)
        posts = [threading.Thread(target=_post, args=(port,), daemon=True) for _ in range(4)]
        for t in posts:
            t.start()
        time.sleep(0.7)
        worker = _named(process_tree(cap.pid), "VLLM::Worker")
        if worker is not None:
            os.kill(worker, signal.SIGSTOP)
        _out, err = cap.communicate(timeout=240)
    finally:
        if cap.poll() is None:
            cap.kill()
            cap.wait()
    stderr = err.decode("utf-8", "replace")
    return {"returncode": cap.returncode, "worker": worker, "stderr": stderr}


def test_a_frozen_worker_is_a_serving_stall_with_snapshots(
    vllm_cpu: Any, vllm_tools: Any, tmp_path: Path
) -> None:
    from kk3evidence.analysis.hang import describe_stall
    from kk3evidence.bundle.archive import open_bundle, validate

    bundle = tmp_path / "stall.tar"
    # stats every 2 s instead of 10: the one zero line comes sooner (the silence is the same)
    env = {**os.environ, **vllm_tools.env, "VLLM_LOG_STATS_INTERVAL": "2"}
    with vllm_tools.lock():
        got = record(str(vllm_cpu.vllm), str(vllm_cpu.model), bundle, vllm_tools.free_port(), env)
    assert got["worker"] is not None, got["stderr"][-2000:]
    assert "stopped moving while serving" in got["stderr"], got["stderr"][-2000:]
    assert validate(bundle) == []
    with open_bundle(bundle) as b:
        launch, analysis = b.launch or {}, b.analysis or {}
        snap = b.json("stalls/snapshot-1.json")
    assert launch["stop"]["reason"] == "serving-stall"
    assert snap["context"]["trigger"] == "serving-stall"
    ff = analysis["first_failure"]
    assert (ff["rule"], ff["basis"], ff["stage"], ff["category"]) == (
        "STALL002", "stall", "serving", "hang"
    )
    assert "Running: 4 reqs" in ff["text"] and "Avg generation throughput: 0.0" in ff["text"]
    procs = {p["pid"]: p for p in analysis["stall"]["processes"]}
    assert procs[got["worker"]]["stopped"] is True
    assert any("collective_rpc" in str(p.get("waiting_in")) for p in procs.values())
    assert "STOPPED" in "\n".join(describe_stall(analysis["stall"]))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    from twonode import store_fixture

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1"}
    res = record(os.environ["KK3_VLLM_BIN"], os.environ["KK3_TINY_MODEL"], out / "stall.tar",
                 18777, env)
    print(f"capture rc={res['returncode']} frozen worker pid={res['worker']}")
    if len(sys.argv) > 2:
        from kk3evidence.bundle.archive import open_bundle

        keep = Path(sys.argv[2])
        keep.mkdir(parents=True, exist_ok=True)
        store_fixture(out / "stall.tar", keep / "bundle.tar", out)
        with open_bundle(keep / "bundle.tar") as b:
            (keep / "output.log").write_bytes(b.read_bytes("logs/combined.log"))
