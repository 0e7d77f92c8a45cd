"""``capture --attach`` to a real vLLM started in the background with its output in a file:
the bundle has the /proc fingerprint, the followed log, the fixed request and /metrics, and
the server is still running afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kk3evidence.bundle.archive import open_bundle, validate

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
PORTS = range(18640, 18650)


def _port() -> int:
    import socket

    for port in PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 18640-18649")


def test_attach_to_a_background_vllm(
    vllm_tools: SimpleNamespace, vllm_cpu: object, tmp_path: Path
) -> None:
    port = _port()
    log = tmp_path / "vllm.log"
    bundle = tmp_path / "attached.tar"
    argv = vllm_tools.serve_argv(vllm_cpu, port)
    with vllm_tools.lock(), open(log, "wb") as fh:
        server = subprocess.Popen(
            argv,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, **vllm_tools.env},
            start_new_session=True,
        )
        try:
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "kk3evidence",
                    "capture",
                    "-o",
                    str(bundle),
                    "--attach",
                    str(server.pid),
                    "--log",
                    str(log),
                    "--url",
                    f"http://127.0.0.1:{port}",
                    "--ready-timeout",
                    "400",
                    "--follow",
                    "2",
                ],
                capture_output=True,
                timeout=560,
                check=False,
            )
            still_running = server.poll() is None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGINT)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(30)
    assert r.returncode == 0, r.stderr[-3000:]
    assert still_running
    assert validate(bundle) == []
    with open_bundle(bundle) as b:
        assert b.launch is not None and b.fingerprint is not None and b.analysis is not None
        assert b.launch["pid"] == server.pid and b.launch["served_model"] == "tiny"
        assert b.fingerprint["python"]["vllm_version"]
        assert b.fingerprint["libraries"], "no loaded library found under the server"
        (req,) = b.requests()
        assert req["status"] == 200
        assert b.analysis["last_stage_reached"] in ("api_ready", "serving")
        assert "api_ready" in b.launch["stages_reached"]
        log_bytes = b.read_bytes("logs/combined.log")
    assert b"Application startup complete" in log_bytes
