"""After the capture shim is SIGKILLed its server keeps running: ``seal`` must say so."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

from click.testing import CliRunner
from progs.helpers import PY, base_env, capture_argv

from kk3evidence.cli import main


def test_seal_says_the_server_is_still_running(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    cmd = [PY, "-c", "import time\nprint('ready', flush=True)\ntime.sleep(600)"]
    proc = subprocess.Popen(
        capture_argv(tmp_path / "run.tar", cmd, ["--staging", str(staging), "--no-probe"]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=base_env())
    pid = None
    try:
        assert proc.stdout is not None
        while b"ready" not in proc.stdout.readline():
            pass
        launch = json.loads((staging / "launch.json").read_text())
        pid = launch["pid"]
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        res = CliRunner().invoke(main, ["seal", str(staging), "-o", str(tmp_path / "s.tar")])
        assert res.exit_code == 0, res.output
        assert f"still running (pid {pid}:" in res.output
        assert f"kill -INT {pid}" in res.output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    # once it is gone (reaped, or a zombie without a command line), seal says nothing more
    while _cmdline(pid):
        os.sched_yield()
    res = CliRunner().invoke(main, ["seal", str(staging), "-o", str(tmp_path / "t.tar")])
    assert "still running" not in res.output


def _cmdline(pid: int | None) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
