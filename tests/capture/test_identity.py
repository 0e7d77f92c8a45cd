"""Server identity: a stale server on the port is never taken for the launched command.

The real-vLLM form of this defect (issue 10: an old ``vllm serve --served-model-name old`` on
port 8800 answered for the new command, which was SIGINTed before it could say "Address already
in use") is reproduced here with two real HTTP servers on loopback: the stale one started first,
the captured one failing to bind.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from progs.helpers import PY, free_port, own_lines, prog, run_capture

from kk3evidence.bundle.archive import open_bundle, validate
from kk3evidence.capture import identity


def _server(port: int, *extra: str) -> list[str]:
    return [PY, prog("fake_openai.py"), "--host", "127.0.0.1", "--port", str(port), *extra]


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    # The stale server prints its ready line once it listens: read until then.
    assert proc.stdout is not None
    for raw in proc.stdout:
        if b"Application startup complete" in raw or b"Uvicorn running" in raw \
                or identity.listening_inodes(port):
            return
    raise AssertionError("stale server never listened")


def test_a_stale_server_on_the_port_is_the_outcome_not_the_api(tmp_path: Path) -> None:
    port = free_port()
    stale = subprocess.Popen(_server(port, "--served-model-name", "old"),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        _wait_listening(port, stale)
        holder = identity.port_holder(port)
        assert holder is not None and holder.pid == stale.pid
        assert "fake_openai.py" in holder.cmdline
        bundle = tmp_path / "run.tar"
        ran = run_capture(bundle, _server(port), ["--probe", "--stop-after-request",
                                                  "--ready-timeout", "60"])
        assert stale.poll() is None  # the stale server was left alone
    finally:
        os.killpg(stale.pid, signal.SIGTERM)
        stale.wait(30)
        if stale.stdout is not None:
            stale.stdout.close()
    # CMD failed to bind on its own and its exit status is capture's
    assert ran.returncode != 0
    assert validate(bundle) == []
    with open_bundle(bundle) as b:
        launch = b.launch
        reqs = b.requests()
        log = b"".join(b.iter_log_lines())
    assert launch is not None
    assert launch["port_holder"] == {"port": port, "pid": stale.pid,
                                     "cmdline": holder.cmdline}
    assert reqs == []  # no request went to the foreign server
    assert launch.get("stopped_by") != "stop-after-request"  # CMD was not killed by capture
    assert launch["ready_seconds"] is None
    assert b"Address already in use" in log or b"EADDRINUSE" in log or b"Errno 98" in log
    said = "\n".join(own_lines(ran.stderr))
    assert f"port {port} held by pid {stale.pid}" in said


def test_the_launched_servers_own_listener_counts(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(_server(port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        _wait_listening(port, server)
        assert identity.check_listener(port, server.pid) is None
        # a root pid whose tree does not hold the listener (this test process is the
        # server's parent, so its tree would)
        why = identity.check_listener(port, 2**22 + 7)
        assert why is not None and f"held by pid {server.pid}" in why
        assert identity.port_holder(port, exclude=[server.pid]) is None
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
        if server.stdout is not None:
            server.stdout.close()


def test_model_mismatch_is_not_ready() -> None:
    assert identity.check_model("tiny", ["tiny"]) is None
    assert identity.check_model("/models/x/", ["/models/x"]) is None
    why = identity.check_model("old", ["tiny"])
    assert why is not None and "'old'" in why and "'tiny'" in why
    assert identity.check_model(None, ["tiny"]) is None


def test_fake_proc_tree(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    header = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   "
              "uid  timeout inode\n")
    (proc / "net" / "tcp").write_text(
        header + "   0: 0100007F:2260 00000000:0000 0A 00000000:00000000 00:00000000 00000000  "
        "0        0 4242 1 0000000000000000 100 0 0 10 0\n")
    (proc / "net" / "tcp6").write_text(header)
    for pid, ppid, fds in ((10, 1, {"3": "socket:[4242]"}), (11, 10, {"1": "/dev/null"})):
        d = proc / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "stat").write_text(f"{pid} (python) S {ppid} {pid} 0 0")
        (d / "cmdline").write_bytes(b"vllm\0serve\0old\0")
        for fd, target in fds.items():
            os.symlink(target, d / "fd" / fd)
    assert identity.listening_inodes(8800, str(proc)) == {4242}
    holder = identity.port_holder(8800, str(proc))
    assert holder is not None and holder.describe() == "port 8800 held by pid 10: vllm serve old"
    assert identity.check_listener(8800, 10, str(proc)) is None
    assert identity.check_listener(8800, 11, str(proc)) is not None
    assert identity.port_holder(8801, str(proc)) is None


def test_capture_summary_keeps_the_estimated_maximum_model_length() -> None:
    from kk3evidence.analysis.engine import analyze

    real = Path(__file__).resolve().parents[1] / "data" / "realruns"
    data = analyze(real / "fail_kv_cache_too_small" / "output.log").to_json()
    from kk3evidence.analysis.engine_config import engine_numbers

    (line,) = engine_numbers(data)
    assert "896" in line and "--max-model-len 896" in line
    assert engine_numbers({"engine_config": None}) == []


def test_an_unknown_launch_pid_never_accepts_an_answering_server(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(_server(port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        _wait_listening(port, server)
        why = identity.check_listener(port, None)
        assert why is not None and "not known yet" in why
        verify = identity.verifier("127.0.0.1", port, lambda: server.pid, ["tiny"])
        assert verify("tiny") is None
        assert verify("old") is not None  # the right socket, the wrong model
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
        if server.stdout is not None:
            server.stdout.close()
