"""capture on the real vLLM CPU build (tiny local model): a clean start with the fixed request
and the prefix probe ended with Ctrl-C, and a failing start (no weights) that analyzes to
weights_access. Two vLLM starts in all (~25-45 s each)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kk3evidence.bundle.archive import open_bundle, validate

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _read_stderr_until(proc: subprocess.Popen[bytes], marker: bytes) -> bytes:
    assert proc.stderr is not None
    seen = b""
    while marker not in seen:
        chunk = os.read(proc.stderr.fileno(), 65536)
        if not chunk:
            raise AssertionError(f"capture ended before {marker!r}:\n{seen[-3000:]!r}")
        seen += chunk
    return seen


def test_clean_start_fixed_request_prefix_probe_and_ctrl_c(
    vllm_cpu: Any, vllm_tools: SimpleNamespace, tmp_path: Path
) -> None:
    bundle = tmp_path / "clean.tar"
    port = vllm_tools.free_port()
    serve = vllm_tools.serve_argv(vllm_cpu, port, "--enable-prefix-caching")
    argv = [
        sys.executable,
        "-m",
        "kk3evidence",
        "capture",
        "-o",
        str(bundle),
        "--ready-timeout",
        "300",
        "--prefix-probe",
        "--note",
        "e2e clean start",
        "--change",
        "prefix_caching=off->on",
        "--",
        *serve,
    ]
    env = dict(os.environ, **vllm_tools.env, HF_TOKEN="hf_e2eSecretValue0123456789abcdef")
    stdout_file = tmp_path / "stdout.log"
    with vllm_tools.lock(), stdout_file.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, env=env)
        try:
            seen = _read_stderr_until(proc, b"requests done; the server keeps running")
            proc.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal does
            _, rest = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    stderr = seen + rest
    assert proc.returncode == 0, stderr[-3000:]
    assert validate(bundle) == []
    with open_bundle(bundle) as b:
        launch, fp, notes = b.launch, b.fingerprint, b.notes
        analysis = b.analysis
        reqs = {r["name"]: r for r in b.requests()}
        before, after = b.metrics("before"), b.metrics("after")
        probe = json.loads(b.read_bytes("probes/prefix_probe.json"))
        log = b.read_bytes("logs/combined.log")
        everything = b"".join(b.read_bytes(n) for n in b.names())
    assert launch is not None and fp is not None and notes is not None
    # the command, exactly as run, and how it ended
    assert launch["argv"] == serve
    assert launch["exit_code"] == 0 and launch["interrupted_by"] == "SIGINT"
    assert 0 < launch["ready_seconds"] < 300
    assert launch["served_model"] == "tiny"
    assert {"api_ready", "serving"} <= set(launch["stages_reached"])
    # the fixed request
    fixed = reqs["fixed-1"]
    assert fixed["status"] == 200 and fixed["usage"]["prompt_tokens"] > 0
    assert fixed["response_body"]["choices"][0]["message"]["content"] is not None
    assert before and "vllm:prefix_cache_queries_total" in before and after
    # the prefix probe: block 128 on the CPU backend, a hit on the 2nd identical request
    assert probe["block_size"] == 128 and probe["prefix_caching_enabled"] is True
    assert probe["exceeds_one_block"] is True
    checks = {c["id"]: c["status"] for c in probe["checks"]}
    assert checks["second_request_hits_cache"] == "pass", probe
    assert checks["inputs_identical"] == "pass"
    assert checks["no_memory_error_after_enable"] == "pass"
    # the fingerprint: the served program's own Python side and libraries
    assert Path(fp["python"]["interpreter"]).parent == vllm_cpu.vllm.parent  # the venv's python
    assert fp["python"]["vllm_version"].startswith("0.32.0")
    assert fp["python"]["torch_version"].endswith("+cpu")
    assert fp["python"]["torch_cuda"] is None
    assert any(lib["name"] == "libtorch_cpu" for lib in fp["libraries"])
    assert fp["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert fp["env"]["HF_TOKEN"].startswith("<redacted:")
    assert b"hf_e2eSecretValue0123456789abcdef" not in everything
    # the log: byte-exact pass-through of what vLLM printed, analyzed without failure
    assert b"Application startup complete" in log
    assert analysis is not None and analysis["first_failure"] is None
    assert notes["changes"][0]["variable"] == "prefix_caching"


def test_failing_start_without_weights_analyzes_to_weights_access(
    vllm_cpu: Any, vllm_tools: SimpleNamespace, tmp_path: Path
) -> None:
    model = tmp_path / "no-weights"
    shutil.copytree(vllm_cpu.model, model, ignore=shutil.ignore_patterns("*.safetensors"))
    run = vllm_tools.capture(vllm_cpu, tmp_path / "fail.tar", model=model)
    assert run.returncode == 1, run.stderr[-3000:]
    assert validate(run.bundle) == []
    with open_bundle(run.bundle) as b:
        analysis, launch = b.analysis, b.launch
    assert launch is not None and launch["exit_code"] == 1
    assert launch["ready_seconds"] is None
    assert launch["ready_error"].startswith("api_ready not reached")
    assert analysis is not None
    ff = analysis["first_failure"]
    assert ff is not None and ff["stage"] == "weights_access", ff
    assert b"Cannot find any model weights" in run.stderr + run.stdout
    summary = [
        ln
        for ln in run.stderr.decode(errors="replace").splitlines()
        if ln.startswith("kk3evidence: bundle")
    ]
    assert summary and "first causal failure" in summary[-1] and "weights_access" in summary[-1]
