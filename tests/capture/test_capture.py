"""capture with real processes: pass-through, exit statuses, signals, floods, crash safety."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from progs.helpers import (
    PY,
    all_member_bytes,
    base_env,
    capture_argv,
    child_stderr,
    own_lines,
    per_stream,
    prog,
    run_capture,
)

from kk3evidence.bundle.archive import open_bundle, seal, validate

Spawn = Callable[..., "subprocess.Popen[bytes]"]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Popen that never outlives the test: the capture and its command's group are killed."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, **kwargs)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            for child in _children(proc.pid):
                with contextlib.suppress(OSError):
                    os.killpg(child, signal.SIGKILL)
            proc.kill()
        proc.wait(30)


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2 :].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _members(bundle: Path) -> dict[str, bytes]:
    with open_bundle(bundle) as b:
        return {n: b.read_bytes(n) for n in b.names()}


def test_output_passes_through_byte_exact_and_is_recorded_per_line(tmp_path: Path) -> None:
    bundle = tmp_path / "run.tar"
    ran = run_capture(bundle, [PY, prog("printer.py"), "--lines", "20", "--binary", "--partial"])
    expected_out = b"".join(b"out line %d\n" % i for i in range(20)) + (
        b"bytes \xff\xfe\x00 raw\nprogress 10%\rprogress 50%\rprogress 100%\n"
        + "유니코드 줄\n".encode()
        + b"no newline at the end"
    )
    expected_err = b"".join(b"err line %d\n" % i for i in range(20))
    assert ran.returncode == 0
    assert ran.stdout == expected_out
    assert child_stderr(ran.stderr) == expected_err
    assert validate(bundle) == []
    members = _members(bundle)
    streams = per_stream(members["logs/combined.log"], members["logs/lines.tsv"])
    assert streams == {"out": expected_out, "err": expected_err}
    rows = members["logs/lines.tsv"].decode().splitlines()[1:]
    assert len(rows) == 20 + 3 + 1 + 20  # the partial last line is a line of its own


def test_exit_code_of_the_command_is_capture_exit_status(tmp_path: Path) -> None:
    bundle = tmp_path / "run.tar"
    ran = run_capture(bundle, [PY, prog("printer.py"), "--exit", "7"])
    assert ran.returncode == 7
    with open_bundle(bundle) as b:
        launch = b.launch
    assert launch is not None
    assert launch["exit_code"] == 7 and launch["signal"] is None and launch["exit_status"] == 7
    assert launch["ended_at"] is not None and launch["pid"] > 0


@pytest.mark.parametrize(
    ("how", "signum"),
    [
        (["kill", "SIGKILL"], signal.SIGKILL),
        (["kill", "SIGSEGV"], signal.SIGSEGV),
        (["abort"], signal.SIGABRT),
    ],
)
def test_command_killed_by_signal_exits_128_plus_n(
    tmp_path: Path, how: list[str], signum: int
) -> None:
    bundle = tmp_path / "run.tar"
    ran = run_capture(bundle, [PY, prog("crasher.py"), *how])
    assert ran.returncode == 128 + signum
    with open_bundle(bundle) as b:
        launch = b.launch
    assert launch is not None
    assert launch["signal"] == signum and launch["exit_code"] is None
    assert launch["exit_status"] == 128 + signum


def test_crash_traceback_is_recorded_and_analyzed(tmp_path: Path) -> None:
    bundle = tmp_path / "run.tar"
    ran = run_capture(bundle, [PY, prog("crasher.py"), "raise"])
    assert ran.returncode == 1
    assert b"Cannot find any model weights" in ran.stderr
    with open_bundle(bundle) as b:
        log = b.read_bytes("logs/combined.log")
        has_analysis = b.has("analysis.json")
    assert b"Traceback (most recent call last)" in log
    assert b"RuntimeError: Cannot find any model weights with /nonexistent" in log
    summary = [line for line in own_lines(ran.stderr) if "bundle" in line]
    assert summary, ran.stderr
    if has_analysis:
        assert "first causal failure" in summary[-1]


def test_command_not_found_exits_127_and_still_writes_a_bundle(tmp_path: Path) -> None:
    bundle = tmp_path / "run.tar"
    ran = run_capture(bundle, ["kk3-no-such-program-here"])
    assert ran.returncode == 127
    assert validate(bundle) == []
    with open_bundle(bundle) as b:
        assert b.launch is not None
        assert "cannot run" in b.launch["start_error"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_to_capture_is_forwarded_to_the_command(
    tmp_path: Path, sig: int, spawn: Spawn
) -> None:
    bundle = tmp_path / "run.tar"
    name = signal.Signals(sig).name
    cmd = [PY, prog("signals.py"), "--exit-on", f"{name}=42"]
    proc = spawn(
        capture_argv(bundle, cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=base_env()
    )
    seen = _read_until(proc, b"ready\n")
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 42
    assert seen + rest == f"ready\ngot {name}\n".encode()
    with open_bundle(bundle) as b:
        assert b.launch is not None
        assert b.launch["interrupted_by"] == name
        assert b.launch["exit_code"] == 42


def _tgkill(pid: int, tid: int, sig: int) -> None:
    """Send ``sig`` to one thread of another process (Linux tgkill(2))."""
    import ctypes
    import platform

    numbers = {"x86_64": 234, "aarch64": 131}
    if platform.machine() not in numbers:
        pytest.skip(f"tgkill syscall number unknown on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(numbers[platform.machine()], pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill failed")


def test_signal_delivered_to_a_worker_thread_still_reaches_the_command(
    tmp_path: Path, spawn: Spawn
) -> None:
    """The kernel may hand a process-directed signal to any thread; capture must forward it
    even when the main thread is waiting for CMD (a regression: it used to deadlock)."""
    bundle = tmp_path / "run.tar"
    cmd = [PY, prog("signals.py"), "--exit-on", "SIGTERM=42"]
    proc = spawn(
        capture_argv(bundle, cmd, ["--no-probe"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=base_env(),
    )
    _read_until(proc, b"ready\n")
    tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
    assert tids, "capture runs worker threads (pump, log writer)"
    _tgkill(proc.pid, tids[0], signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 42


def test_second_ctrl_c_kills_the_process_group(tmp_path: Path, spawn: Spawn) -> None:
    bundle = tmp_path / "run.tar"
    cmd = [PY, prog("signals.py"), "--ignore", "SIGINT"]
    proc = spawn(
        capture_argv(bundle, cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=base_env()
    )
    _read_until(proc, b"ready\n")
    proc.send_signal(signal.SIGINT)
    first = _read_until(proc, b"Ctrl-C again", stream="stderr")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    err = first + err
    assert proc.returncode == 128 + signal.SIGKILL
    assert any("second Ctrl-C" in line for line in own_lines(err))


def test_leftover_group_members_are_stopped_after_the_grace_period(
    tmp_path: Path, spawn: Spawn
) -> None:
    bundle = tmp_path / "run.tar"
    # The child exits on SIGTERM; its grandchild ignores SIGTERM and must be SIGKILLed.
    cmd = [PY, prog("signals.py"), "--child", "--exit-on", "SIGTERM=0"]
    proc = spawn(
        capture_argv(bundle, cmd, ["--grace", "0.5"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=base_env(),
    )
    seen = _read_until(proc, b"grandchild ready\n")
    gpid = int(seen.split(b"grandchild pid ")[1].split()[0])
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert _gone(gpid)
    assert any("SIGKILL" in line for line in own_lines(err)), err


def test_flood_is_passed_through_completely_and_every_byte_is_recorded_or_accounted(
    tmp_path: Path,
) -> None:
    """The pass-through never loses a byte; the log keeps every byte the writer could take and
    the manifest accounts for the rest (capture never blocks CMD, so a writer starved of CPU
    drops from the *log* and says so; bench/capture_bench.py measures how often)."""
    bundle = tmp_path / "run.tar"
    ran = run_capture(bundle, [PY, prog("flood.py"), "64"], timeout=300)
    assert ran.returncode == 0
    assert len(ran.stdout) == 64 * 1024 * 1024
    n_lines = ran.stdout.count(b"\n")
    assert f"flood: wrote {n_lines} lines in ".encode() in ran.stderr
    received = len(ran.stdout) + len(child_stderr(ran.stderr))
    with open_bundle(bundle) as b:
        logged = b.member("logs/combined.log").size
        rows = sum(1 for _ in b.iter_log_lines())
        losses = [x for x in b.manifest["losses"] if x["member"] == "logs/combined.log"]
    lost_bytes = sum(x["bytes"] for x in losses)
    lost_lines = sum(x["lines"] for x in losses)
    assert logged + lost_bytes == received
    # + the partial last line + the stderr summary line; a dropped block's partial line may
    # join the next one, so rows are counted within the lines the losses account for
    assert n_lines + 2 - lost_lines - len(losses) <= rows <= n_lines + 2
    if not losses:
        assert rows == n_lines + 2


def test_killed_capture_is_sealed_with_every_line_received(tmp_path: Path, spawn: Spawn) -> None:
    bundle = tmp_path / "run.tar"
    staging = tmp_path / "staging"
    cmd = [
        PY,
        "-c",
        "import time\nfor i in range(2000): print('line', i)\nprint('ready', flush=True)\n"
        "time.sleep(600)",
    ]
    proc = spawn(
        capture_argv(bundle, cmd, ["--staging", str(staging)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=base_env(),
    )
    _read_until(proc, b"ready\n")
    log = staging / "logs" / "combined.log"
    # The writer thread flushes each batch straight to the file; wait until it holds the marker.
    while b"ready\n" not in (log.read_bytes() if log.exists() else b""):
        os.sched_yield()
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    _kill_orphans(staging)
    sealed = seal(staging, tmp_path / "sealed.tar")
    assert validate(sealed) == []
    with open_bundle(sealed) as b:
        lines = list(b.iter_log_lines())
        assert b.manifest["sealed_from_staging"] is True
        assert b.launch is not None and b.launch["pid"] > 0
    assert lines == [b"line %d\n" % i for i in range(2000)] + [b"ready\n"]


def test_killed_capture_keeps_an_unfinished_last_line(tmp_path: Path, spawn: Spawn) -> None:
    """A line still waiting for its newline when the shim is SIGKILLed is sealed too
    (redacted, like every other line)."""
    bundle = tmp_path / "run.tar"
    staging = tmp_path / "staging"
    secret = "hf_" + "Q" * 30
    cmd = [
        PY,
        "-c",
        "import sys, time\nprint('first', flush=True)\n"
        f"sys.stdout.write('no newline yet {secret}'); sys.stdout.flush()\ntime.sleep(600)",
    ]
    proc = spawn(
        capture_argv(bundle, cmd, ["--staging", str(staging), "--no-probe"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=base_env(HF_TOKEN=secret),
    )
    _read_until(proc, b"no newline yet")
    tail = staging / "logs" / "combined.log.partial-0"
    # print() writes 'first' and its newline separately: an earlier tail may hold just 'first'.
    while not (tail.exists() and b"no newline yet" in _read_or_empty(tail)):
        os.sched_yield()
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    _kill_orphans(staging)
    sealed = seal(staging, tmp_path / "sealed.tar")
    assert validate(sealed) == []
    with open_bundle(sealed) as b:
        lines = list(b.iter_log_lines())
    assert lines[0] == b"first\n"
    assert lines[1].startswith(b"no newline yet <redacted:")
    assert secret.encode() not in b"".join(lines)


def _kill_orphans(staging: Path) -> None:
    launch = json.loads((staging / "launch.json").read_text())
    try:
        os.killpg(launch["pid"], signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_write_errors_never_stop_the_pass_through_and_are_recorded(tmp_path: Path) -> None:
    bundle = tmp_path / "run.tar"
    limit = 256 * 1024

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run(
        capture_argv(bundle, [PY, prog("flood.py"), "4"]),
        capture_output=True,
        env=base_env(),
        preexec_fn=small_files,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0
    assert len(proc.stdout) == 4 * 1024 * 1024
    msgs = own_lines(proc.stderr)
    assert any("cannot record output" in m for m in msgs), msgs
    # The bundle itself may not fit under the limit either: then the staging folder is kept.
    if bundle.exists():
        with open_bundle(bundle) as b:
            assert b.manifest["losses"], b.manifest
    else:
        assert any("seal" in m for m in msgs), msgs


def test_notes_and_changes_are_stored(tmp_path: Path) -> None:
    bundle = tmp_path / "run.tar"
    ran = run_capture(
        bundle,
        [PY, prog("printer.py"), "--lines", "1"],
        [
            "--note",
            "first try after the image update",
            "--change",
            "driver=570.86.15->580.65.06",
            "--change",
            "image=a:1->b:2@2026-11-29T10:00:00Z",
        ],
    )
    assert ran.returncode == 0
    with open_bundle(bundle) as b:
        notes = b.notes
    assert notes is not None
    assert notes["notes"] == ["first try after the image update"]
    assert notes["changes"][0]["variable"] == "driver"
    assert notes["changes"][0]["from"] == "570.86.15"
    assert notes["changes"][0]["to"] == "580.65.06"
    assert notes["changes"][1]["at"].startswith("2026-11-29T10:00:00")


def test_a_malformed_change_is_a_usage_error(tmp_path: Path) -> None:
    ran = run_capture(tmp_path / "run.tar", [PY, "-c", "pass"], ["--change", "driver 570"])
    assert ran.returncode == 2
    assert own_lines(ran.stderr)[0].startswith("kk3evidence: error: --change")
    assert not (tmp_path / "run.tar").exists()


def test_no_secret_from_env_argv_or_log_text_reaches_the_bundle(tmp_path: Path) -> None:
    bundle = tmp_path / "run.tar"
    secrets = {
        "HF_TOKEN": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
        "MY_SERVICE_PASSWORD": "correct-horse-battery-staple",
        "VLLM_API_KEY": "vllm-key-0123456789abcdef",
    }
    cmd = [
        PY,
        prog("printer.py"),
        "--lines",
        "1",
        *[a for k in secrets for a in ("--secret-env", k)],
        "--api-key",
        "argv-secret-0123456789",
    ]
    ran = run_capture(bundle, cmd, env=base_env(**secrets))
    assert ran.returncode == 0, ran.stderr
    assert secrets["HF_TOKEN"].encode() in ran.stderr  # the terminal sees the real output
    data = all_member_bytes(bundle)
    for value in [*secrets.values(), "argv-secret-0123456789"]:
        assert value.encode() not in data, value
    with open_bundle(bundle) as b:
        assert b.fingerprint is not None
        assert b.fingerprint["env"]["HF_TOKEN"].startswith("<redacted:")
        assert b.redactions


def test_fingerprint_of_a_plain_command_is_complete_and_valid(tmp_path: Path) -> None:
    bundle = tmp_path / "run.tar"
    ran = run_capture(
        bundle,
        [PY, "-c", "print('hi')"],
        ["--image", "repo/img:tag"],
        env=base_env(CUDA_VISIBLE_DEVICES="0,1", NCCL_DEBUG="INFO"),
    )
    assert ran.returncode == 0
    with open_bundle(bundle) as b:
        fp = b.fingerprint
    assert fp is not None
    assert fp["host"]["hostname"] and fp["host"]["kernel"]
    assert fp["gpus"]["source"] in ("none", "nvml", "error")
    assert fp["container"]["image_ref"] == "repo/img:tag"
    assert fp["container"]["image_ref_source"] == "option --image"
    assert fp["python"]["interpreter"] == PY
    assert fp["python"]["python_version"]
    assert fp["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert fp["env"]["NCCL_DEBUG"] == "INFO"
    names = {p["name"] for p in fp["probes"]}
    assert {"host", "gpus", "container", "python", "libraries"} <= names


def test_existing_staging_folder_is_refused_with_a_hint(tmp_path: Path) -> None:
    staging = tmp_path / "st"
    staging.mkdir()
    (staging / "launch.json").write_text("{}")
    ran = run_capture(tmp_path / "run.tar", [PY, "-c", "pass"], ["--staging", str(staging)])
    assert ran.returncode == 2
    assert "seal" in own_lines(ran.stderr)[0]


def _read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # replaced between the two looks
        return b""


def _read_until(proc: subprocess.Popen[bytes], marker: bytes, stream: str = "stdout") -> bytes:
    pipe = proc.stdout if stream == "stdout" else proc.stderr
    assert pipe is not None
    seen = b""
    while marker not in seen:
        chunk = os.read(pipe.fileno(), 65536)
        if not chunk:
            raise AssertionError(f"EOF before {marker!r}: {seen!r}")
        seen += chunk
    return seen


def _gone(pid: int) -> bool:
    """No such process, or only a zombie left for init to reap."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] in "ZX"
