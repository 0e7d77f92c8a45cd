"""The stall watchdog, stall snapshots and the escalating stop, with real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from progs.helpers import PY, base_env, capture_argv, free_port, prog, run_capture

from kk3evidence.bundle.archive import open_bundle, validate
from kk3evidence.capture import snapshot as snap
from kk3evidence.capture.watchdog import StopRecord, escalate, parse_stall_after
from kk3evidence.errors import UsageError

STALL = prog("stall.py")


def _bundle(path: Path) -> tuple[dict, dict, list[dict]]:
    with open_bundle(path) as b:
        stalls = [b.json(n) for n in b.names() if n.startswith("stalls/")]
        return b.launch or {}, b.analysis or {}, stalls


def test_stall_after_takes_per_stage_budgets_and_refuses_nonsense() -> None:
    assert parse_stall_after(["900", "engine_init=1800"]) == (900.0, {"engine_init": 1800.0})
    assert parse_stall_after([]) == (None, {})
    for bad in ("soon", "-1", "warmup=10"):
        with pytest.raises(UsageError):
            parse_stall_after([bad])


@pytest.mark.slow
def test_a_silent_start_up_is_snapshotted_and_stopped_even_when_it_ignores_sigterm(
    tmp_path: Path,
) -> None:
    bundle = tmp_path / "b.tar"
    ran = run_capture(
        bundle,
        [PY, STALL, "--ignore-term", "--children", "2", "--listen"],
        ["--no-probe", "--stall-after", "2", "--stall-action", "stop", "--grace", "1"],
        timeout=120,
    )
    assert ran.returncode == 128 + signal.SIGKILL, ran.stderr[-2000:]
    assert validate(bundle) == []
    launch, analysis, stalls = _bundle(bundle)
    # SIGINT and SIGTERM were ignored: SIGKILL ended it, and launch.json says so.
    assert [s["signal"] for s in launch["stop"]["sent"]] == ["SIGINT", "SIGTERM", "SIGKILL"]
    assert launch["stop"]["ended_by"] == "SIGKILL" and launch["stop"]["reason"] == "stall"
    assert launch["stalls"] == ["stalls/snapshot-1.json", "stalls/snapshot-2.json"]
    first, second = sorted(stalls, key=lambda d: d["seq"])
    pids = {p["pid"] for p in first["processes"]}
    assert len(pids) >= 3  # the command and its two children
    top = next(p for p in first["processes"] if p["pid"] == first["root_pid"])
    assert any(
        s["state"] == "LISTEN" and s["local"].startswith("127.0.0.1:") for s in top["sockets"]
    )
    assert all(t["state"] for t in top["threads"])
    assert top["stacks_source"] in ("py-spy", "proc")
    if top["stacks_source"] == "py-spy":
        frames = [f["function"] for t in top["stacks"] for f in t["frames"]]
        assert "main" in frames
    else:
        assert top["stacks_error"]
    assert first["gpu"]["available"] is False or first["gpu"]["devices"] is not None
    assert second["unchanged"]["compared_with_seq"] == 1
    assert top["pid"] in second["unchanged"]["pids_same_thread_states"] or second["unchanged"]
    ff = analysis["first_failure"]
    assert ff["basis"] == "stall" and ff["category"] == "hang" and ff["stage"] == "comm_group"
    assert "world_size=2 rank=0" in ff["text"]
    assert analysis["stall"]["missing_ranks"] == [1]


@pytest.mark.slow
def test_a_program_that_keeps_printing_slowly_is_never_stalled(tmp_path: Path) -> None:
    # 12 updates 0.5 s apart with \r (tqdm style), budget 2 s: never 2 s without output.
    bundle = tmp_path / "b.tar"
    ran = run_capture(
        bundle,
        [PY, STALL, "--print-every", "0.5", "--prints", "12", "--silent", "0"],
        ["--no-probe", "--stall-after", "2", "--stall-action", "stop"],
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    launch, _analysis, stalls = _bundle(bundle)
    assert stalls == [] and "stop" not in launch and b"stall:" not in ran.stderr


def test_a_program_silent_for_less_than_the_budget_is_not_stalled(tmp_path: Path) -> None:
    bundle = tmp_path / "b.tar"
    ran = run_capture(
        bundle,
        [PY, STALL, "--silent", "1"],
        ["--no-probe", "--stall-after", "4", "--stall-action", "stop"],
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    launch, _analysis, stalls = _bundle(bundle)
    assert stalls == [] and "stop" not in launch


@pytest.mark.slow
def test_a_second_sigterm_to_capture_kills_a_command_that_ignores_the_first(
    tmp_path: Path,
) -> None:
    bundle = tmp_path / "b.tar"
    proc = subprocess.Popen(
        capture_argv(bundle, [PY, STALL, "--ignore-term"], ["--no-probe", "--stall-after", "0"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=base_env(),
    )
    try:
        assert proc.stdout is not None
        assert b"world_size=2" in proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        assert b"signal ignored" in proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGKILL, err[-2000:]
    launch, _a, _s = _bundle(bundle)
    assert launch["stop"]["ended_by"] == "SIGKILL"


def test_escalate_stops_at_the_first_signal_that_works() -> None:
    # The child takes SIGINT's default action itself (a shell's background job inherits SIGINT
    # ignored, as CI may run us) and says so before it is signalled.
    child = (
        "import signal, sys, time; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "print('ready', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([PY, "-c", child], process_group=0, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        rec = StopRecord("test")

        def gone(timeout: float) -> bool:
            try:
                proc.wait(timeout if timeout > 0 else 0.001)
            except subprocess.TimeoutExpired:
                return False
            return True

        escalate(rec, lambda s: os.killpg(proc.pid, s) is None, gone, grace=30, say=lambda m: None)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    assert [s["signal"] for s in rec.sent] == ["SIGINT"] and rec.ended_by == "SIGINT"


def test_a_snapshot_of_a_ten_process_tree_is_complete(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [PY, STALL, "--children", "9", "--listen"], stdout=subprocess.PIPE, process_group=0
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        t0 = time.monotonic()
        doc = snap.take_snapshot(proc.pid, seq=1, reason="test")
        took = time.monotonic() - t0
        json.dumps(doc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    assert len(doc["processes"]) == 10
    assert doc["seconds"] <= took + 0.1
    import jsonschema

    from kk3evidence.bundle.schema import load_schema

    jsonschema.validate(doc, load_schema("stall"))


def test_net_tcp_lines_give_addresses_and_states() -> None:
    text = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
        "timeout inode\n"
        "   0: 0100007F:71B5 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0 "
        "       0 123456 1 0000000000000000 100 0 0 10 0\n"
        "   1: 0100007F:D2F0 0100007F:71B5 01 00000000:00000000 00:00000000 00000000     0 "
        "       0 123457 1 0000000000000000 20 4 30 10 -1\n"
    )
    got = snap.parse_net_tcp(text)
    assert got[123456] == {
        "proto": "tcp",
        "local": "127.0.0.1:29109",
        "remote": "0.0.0.0:0",
        "state": "LISTEN",
    }
    assert got[123457]["remote"] == "127.0.0.1:29109" and got[123457]["state"] == "ESTABLISHED"
    six = snap.parse_net_tcp(
        "hdr\n   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 "
        "0A 00000000:00000000 00:00000000 00000000     0        0 5 1\n",
        "tcp6",
    )
    assert six[5]["local"] == "[::1]:8080"


@pytest.mark.slow
def test_ready_timeout_snapshots_and_stops_a_server_that_never_answers(tmp_path: Path) -> None:
    bundle = tmp_path / "b.tar"
    ran = run_capture(
        bundle,
        [PY, STALL, "--print-every", "0.3", "--prints", "1000"],  # busy printing, never ready
        ["--url", f"http://127.0.0.1:{free_port()}", "--ready-timeout", "3", "--grace", "5"],
        timeout=120,
    )
    assert ran.returncode == 128 + signal.SIGINT or ran.returncode == 1, ran.stderr[-2000:]
    launch, _analysis, stalls = _bundle(bundle)
    assert launch["stop"]["reason"] == "ready-timeout"
    assert (
        launch["stop"]["sent"][0]["signal"] == "SIGINT" and launch["stop"]["ended_by"] == "SIGINT"
    )
    assert stalls and stalls[0]["context"]["trigger"] == "ready-timeout"


def test_without_py_spy_the_snapshot_says_why_and_keeps_proc() -> None:
    proc = subprocess.Popen([PY, STALL, "--listen"], stdout=subprocess.PIPE, process_group=0)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        doc = snap.take_snapshot(proc.pid, seq=1, reason="t", py_spy="/nonexistent/py-spy")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    (p,) = doc["processes"]
    assert p["stacks"] is None and p["stacks_source"] == "proc"
    assert "cannot run py-spy" in p["stacks_error"]
    assert p["threads"] and any(s["state"] == "LISTEN" for s in p["sockets"])


def test_a_signal_is_held_back_only_while_the_group_does_not_exist() -> None:
    # A signal forwarded on arrival must not be sent again once CMD has started: a second
    # SIGTERM during CMD's exit handler killed it (exit 143 instead of its own code).
    from kk3evidence.capture.run import CaptureOptions, _Run

    run = _Run(
        CaptureOptions(argv=("x",)), lambda _m: None, writer=None, redactor=None, argv=["x"], env={}
    )
    sent: list[int] = []
    run.kill_group = lambda s: sent.append(s) or True  # type: ignore[method-assign]
    run.on_signal(signal.SIGTERM, None)
    assert run.early_signals == [signal.SIGTERM] and sent == []
    run.pgid = 12345
    run.on_signal(signal.SIGHUP, None)
    assert run.early_signals == [signal.SIGTERM] and sent == [signal.SIGHUP]


@pytest.mark.slow
def test_requests_that_stop_moving_after_ready_are_snapshotted_as_a_serving_stall(
    tmp_path: Path,
) -> None:
    # Ready, then stats lines with a request running at 0 tokens/s: not an idle server. The
    # watchdog snapshots the tree and, with --stall-action stop, stops it; the bundle's
    # analysis is the serving stall (STALL002) with the snapshot's processes.
    bundle = tmp_path / "b.tar"
    ran = run_capture(
        bundle,
        [PY, STALL, "--serving-stall", "3"],
        ["--no-probe", "--stall-after", "600", "--stall-action", "stop", "--grace", "1"],
        timeout=120,
    )
    assert validate(bundle) == [], ran.stderr[-2000:]
    launch, analysis, stalls = _bundle(bundle)
    assert launch["stop"]["reason"] == "serving-stall", launch.get("stop")
    assert launch["stalls"][:1] == ["stalls/snapshot-1.json"]
    first = min(stalls, key=lambda d: d["seq"])
    assert first["context"]["trigger"] == "serving-stall"
    assert "0 tokens/s on 2 stats lines" in first["reason"]
    ff = analysis["first_failure"]
    assert (ff["rule"], ff["basis"], ff["stage"], ff["category"]) == (
        "STALL002", "stall", "serving", "hang"
    )
    assert analysis["stall"]["snapshots"] and analysis["stall"]["processes"]
