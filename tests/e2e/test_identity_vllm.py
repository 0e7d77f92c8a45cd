"""Server identity on the real vLLM CPU build (issue 10's stale-server defect).

An old ``vllm serve … --served-model-name old`` keeps port P; ``capture --stop-after-request
-- vllm serve … --served-model-name tiny --port P`` must record "port P held by pid N: …", send
no request to the old server, and let the new command fail by itself with "Address already in
use" (vLLM binds its socket before it builds the engine: a few seconds). Two vLLM starts, one of
them short; the stale server is stopped at the end.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from vllm_slots import SLOTS, vllm_slot

from kk3evidence.analysis.engine import analyze
from kk3evidence.bundle.archive import open_bundle, validate

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

#: set to a folder to keep the captured bundle (how tests/data/realruns/fail_stale_server_*
#: was made)
KEEP = os.environ.get("KK3_KEEP_E2E")


def _wait_ready(proc: subprocess.Popen[bytes], port: int) -> None:
    """Poll the stale server's /v1/models (its own readiness, not the code under test)."""
    with httpx.Client(timeout=5.0) as client:
        for _ in range(2400):
            if proc.poll() is not None:
                raise AssertionError(f"stale vLLM exited early ({proc.returncode})")
            try:
                if client.get(f"http://127.0.0.1:{port}/v1/models").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            try:
                proc.wait(0.25)  # bounded wait that also notices an early exit
            except subprocess.TimeoutExpired:
                continue
    raise AssertionError("stale vLLM never became ready")


def test_stale_vllm_on_the_port_is_the_outcome(
    vllm_cpu: Any, vllm_tools: SimpleNamespace, tmp_path: Path
) -> None:
    port = vllm_tools.free_port()
    old = vllm_tools.serve_argv(vllm_cpu, port)
    old[old.index("tiny")] = "old"
    env = dict(os.environ, **vllm_tools.env)
    bundle = tmp_path / "stale.tar"
    with vllm_slot(SLOTS):  # two servers: the stale one and the captured one
        stale = subprocess.Popen(old, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 env=env, start_new_session=True)
        try:
            _wait_ready(stale, port)
            ran = subprocess.run(
                [sys.executable, "-m", "kk3evidence", "capture", "-o", str(bundle),
                 "--ready-timeout", "300", "--stop-after-request", "--",
                 *vllm_tools.serve_argv(vllm_cpu, port)],
                capture_output=True, env=env, timeout=600, check=False)
            stale_alive = stale.poll() is None
        finally:
            os.killpg(stale.pid, signal.SIGINT)
            try:
                stale.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(stale.pid, signal.SIGKILL)
                stale.wait(30)
    if KEEP:
        shutil.copy(bundle, Path(KEEP) / "stale.tar")
    assert stale_alive, "capture must not stop a server it did not start"
    said = ran.stderr.decode(errors="replace")
    assert f"port {port} held by pid {stale.pid}" in said
    assert ran.returncode == 1, said[-3000:]  # CMD's own exit status
    assert validate(bundle) == []
    with open_bundle(bundle) as b:
        launch = b.launch
        reqs = b.requests()
    assert launch is not None
    assert launch["port_holder"]["pid"] == stale.pid
    assert "--served-model-name old" in launch["port_holder"]["cmdline"]
    assert launch["ready_seconds"] is None
    assert launch.get("stopped_by") != "stop-after-request"
    assert reqs == []
    result = analyze(bundle)
    assert result.first_failure is not None
    assert result.first_failure.category == "port"
    assert "Address already in use" in result.first_failure.text
