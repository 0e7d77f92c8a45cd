"""``capture --attach PID``: a bundle from a running server that kk3evidence did not start.

The server is a real process (tests/progs/fake_openai.py: real HTTP on 127.0.0.1, vLLM-like
log lines) started by the test with its output in a file or a pipe; it must still be running
after the attach, and its secrets must not reach the bundle.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from progs.helpers import free_port

from kk3evidence.bundle.archive import open_bundle, validate

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "progs" / "fake_openai.py"
SECRET = "hf_attachSecretValue0123456789abcd"


def _env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}


@contextlib.contextmanager
def _server(out: int | None, port: int) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [sys.executable, str(FAKE), "--port", str(port), "--api-key", "sk-attachKey12345678"],
        stdout=out if out is not None else subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**_env(), "HF_TOKEN": SECRET, "VLLM_LOGGING_LEVEL": "INFO"},
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()


def _attach(*args: str, stdin: int | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "kk3evidence", "capture", *args],
        capture_output=stdin is None,
        stdin=stdin,
        stdout=subprocess.PIPE if stdin is not None else None,
        stderr=subprocess.PIPE if stdin is not None else None,
        env=_env(),
        timeout=240,
        check=False,
    )


def _read_all(bundle: Path, name: str) -> bytes:
    with open_bundle(bundle) as b:
        return b.read_bytes(name)


def test_attach_with_a_log_file_records_server_log_and_request(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    port = free_port()
    with open(log, "wb") as fh, _server(fh.fileno(), port) as srv:
        bundle = tmp_path / "att.tar"
        r = _attach(
            "-o",
            str(bundle),
            "--attach",
            str(srv.pid),
            "--log",
            str(log),
            "--url",
            f"http://127.0.0.1:{port}",
            "--follow",
            "0",
        )
        assert r.returncode == 0, r.stderr
        assert srv.poll() is None  # never stopped
    assert validate(bundle) == []
    with open_bundle(bundle) as b:
        launch, fp = b.launch, b.fingerprint
        assert launch is not None and fp is not None
        assert launch["pid"] == srv.pid and launch["attached"]["server_exited"] is False
        assert "--api-key" in launch["argv"] and "sk-attachKey12345678" not in launch["argv"]
        assert fp["env"]["HF_TOKEN"].startswith("<redacted:")
        (req,) = b.requests()
        assert req["status"] == 200
        assert b.metrics("before") is not None and b.metrics("after") is not None
    text = _read_all(bundle, "logs/combined.log")
    assert b"(APIServer pid=" in text
    raw = bundle.read_bytes()
    assert SECRET.encode() not in raw and b"sk-attachKey12345678" not in raw


def test_attach_follows_a_piped_log(tmp_path: Path) -> None:
    port = free_port()
    with _server(None, port) as srv:
        assert srv.stdout is not None
        bundle = tmp_path / "pipe.tar"
        r = _attach(
            "-o",
            str(bundle),
            "--attach",
            str(srv.pid),
            "--log",
            "-",
            "--url",
            f"http://127.0.0.1:{port}",
            "--follow",
            "0",
            stdin=srv.stdout.fileno(),
        )
        assert r.returncode == 0, r.stderr
        assert srv.poll() is None
    log = _read_all(bundle, "logs/combined.log")
    assert b"POST /v1/chat/completions" in log or b"(APIServer pid=" in log
    index = _read_all(bundle, "logs/lines.tsv").splitlines()
    assert index[0] == b"offset\tstream\twall_ns\tmono_ns" and len(index) > 1


def test_attach_ends_when_the_server_exits(tmp_path: Path) -> None:
    # a server that ends when its stdin closes; the attach has no URL and a long follow time
    srv = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, env=_env()
    )
    assert srv.stdin is not None
    bundle = tmp_path / "exit.tar"
    cap = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kk3evidence",
            "capture",
            "-o",
            str(bundle),
            "--attach",
            str(srv.pid),
            "--follow",
            "600",
            "--no-probe",
        ],
        stderr=subprocess.PIPE,
        env=_env(),
    )
    assert cap.stderr is not None
    first = cap.stderr.readline()
    assert b"attached to pid" in first
    srv.stdin.close()
    srv.wait(30)
    rest = cap.stderr.read()
    cap.stderr.close()
    assert cap.wait(120) == 0, rest
    with open_bundle(bundle) as b:
        assert b.launch is not None and b.launch["attached"]["server_exited"] is True
        assert any(n["what"] == "logs/combined.log" for n in b.not_collected)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--attach", "999999999"], b"no such process"),
        (["--log", "x.log", "--", "true"], b"--log is for --attach"),
        (["--attach", "1", "--", "true"], b"takes no CMD"),
        ([], b"give -- CMD"),
    ],
)
def test_attach_usage_errors(tmp_path: Path, args: list[str], message: bytes) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "kk3evidence", "capture", *args],
        capture_output=True,
        env=_env(),
        cwd=tmp_path,
        check=False,
        timeout=60,
    )
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert b"Traceback" not in r.stderr


def test_attach_missing_log_file_is_a_usage_error(tmp_path: Path) -> None:
    r = _attach(
        "-o",
        str(tmp_path / "x.tar"),
        "--attach",
        str(os.getpid()),
        "--log",
        str(tmp_path / "nope.log"),
    )
    assert r.returncode == 2 and b"no such file" in r.stderr
