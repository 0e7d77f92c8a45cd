"""``capture --attach PID``: a bundle from a server kk3evidence did not start (SPEC §5, 0.2).

In production the pod spec or systemd owns the launch, so nothing can wrap ``vllm serve``.
Attaching reads what a wrapper would have recorded from the outside:

* the fingerprint from ``/proc/PID``: cmdline (as argv, secrets redacted), environment
  (redacted like a captured one), cwd, start time, the libraries the server tree has loaded
  (``procscan``), and the Python side probed with the server's own interpreter;
* the log followed from a file (from its first byte, then as it grows) or from a pipe
  (``docker logs -f …``, ``kubectl logs -f …`` into stdin), each line with its receive time;
* through the URL: readiness, the fixed request(s) and ``/metrics`` before and after.

It never signals the server: it ends when the follow time after the requests has passed, when
the server exits, at the end of a piped log, or on Ctrl-C (which ends only the attach).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

from kk3evidence.capture import group as capture_group
from kk3evidence.capture import http as probe
from kk3evidence.capture import run as runmod
from kk3evidence.capture.procscan import LibraryScanner
from kk3evidence.capture.pump import LineRecorder
from kk3evidence.capture.staging import reserve as reserve_staging
from kk3evidence.errors import CaptureError, UsageError

_POLL_S = 0.2
_READ = 1 << 16


@dataclass(frozen=True, slots=True)
class AttachOptions:
    pid: int
    capture: runmod.CaptureOptions  # output, url, request options, notes, group …
    log: str | None = None  # a file path, "-" for stdin, or None (no log)
    follow: float = 10.0  # seconds to keep following the log after the requests


@dataclass(frozen=True, slots=True)
class ProcInfo:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None
    started_at: datetime | None
    problems: tuple[str, ...]


def _read_proc(pid: int, name: str) -> bytes:
    with open(f"/proc/{pid}/{name}", "rb") as fh:
        return fh.read()


def _start_time(pid: int) -> datetime | None:
    """When PID started: /proc/PID/stat field 22 (clock ticks after boot) + boot time."""
    try:
        stat = _read_proc(pid, "stat").decode("ascii", "replace")
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    return datetime.now(UTC) - timedelta(seconds=max(age, 0.0))


def read_process(pid: int) -> ProcInfo:
    """What /proc says about PID; a missing process is a usage error, unreadable parts are
    recorded as problems (e.g. another user's environment)."""
    try:
        raw = _read_proc(pid, "cmdline")
    except FileNotFoundError:
        raise UsageError(f"--attach {pid}: no such process; give the server's PID") from None
    except OSError as exc:
        raise CaptureError(
            f"--attach {pid}: cannot read /proc/{pid}/cmdline ({exc.strerror})"
        ) from None
    argv = tuple(a.decode("utf-8", "surrogateescape") for a in raw.split(b"\0") if a)
    if not argv:
        raise UsageError(f"--attach {pid}: the process has no command line (a kernel thread?)")
    problems: list[str] = []
    env: dict[str, str] = {}
    try:
        for item in _read_proc(pid, "environ").split(b"\0"):
            key, eq, value = item.partition(b"=")
            if eq:
                env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    except OSError as exc:
        problems.append(f"/proc/{pid}/environ: {exc.strerror} (run as the server's user)")
    try:
        cwd: str | None = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = None
    return ProcInfo(argv, env, cwd, _start_time(pid), tuple(problems))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie has exited; only its parent can reap it
    try:
        stat = _read_proc(pid, "stat").decode("ascii", "replace")
        return stat[stat.rindex(")") + 2] != "Z"
    except (OSError, ValueError, IndexError):
        return False


# --------------------------------------------------------------------------- log follower
class LogFollower:
    """Feeds the log into the recorder from a file (from byte 0, then as it grows; a
    truncated or replaced file is reopened) or from a pipe, until :meth:`stop` or EOF."""

    def __init__(self, source: str, recorder: LineRecorder) -> None:
        self.source = source
        self.recorder = recorder
        self.bytes = 0
        self.eof = threading.Event()  # a pipe ended
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kk3-follow", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _put(self, data: bytes) -> None:
        self.bytes += len(data)
        self.recorder.put(0, data, time.time_ns(), time.monotonic_ns())

    def _run(self) -> None:
        try:
            if self.source == "-":
                self._pipe(sys.stdin.buffer)
            else:
                self._file(Path(self.source))
        except OSError as exc:
            self.error = f"{self.source}: {exc.strerror or exc}"
        finally:
            self.recorder.eof(0)

    def _pipe(self, stream: BinaryIO) -> None:
        fd = stream.fileno()
        while not self._stop.is_set():
            # wait for data with a timeout so that stop() is seen while the pipe is quiet
            ready, _w, _x = select.select([fd], [], [], _POLL_S)
            if not ready:
                continue
            data = os.read(fd, _READ)
            if not data:
                self.eof.set()
                return
            self._put(data)

    def _file(self, path: Path) -> None:
        fh = open(path, "rb")  # noqa: SIM115 - reopened when the file is replaced
        try:
            ident = os.fstat(fh.fileno()).st_ino
            while True:
                data = fh.read(_READ)
                if data:
                    self._put(data)
                    continue
                if self._stop.is_set():
                    return
                time.sleep(_POLL_S)  # a file has no readiness to wait on: poll
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    continue
                if st.st_ino != ident or st.st_size < fh.tell():  # rotated or truncated
                    fh.close()
                    fh = open(path, "rb")  # noqa: SIM115
                    ident = os.fstat(fh.fileno()).st_ino
        finally:
            fh.close()


# ------------------------------------------------------------------------------- attach
def _launch(info: ProcInfo, pid: int, shown_argv: list[str], attached: datetime) -> dict[str, Any]:
    return {
        "schema": runmod.LAUNCH_SCHEMA,
        "argv": shown_argv,
        "cwd": info.cwd or "",
        "pid": pid,
        "started_at": (info.started_at or attached).isoformat(),
        "ended_at": None,
        "exit_code": None,
        "signal": None,
        "exit_status": None,
        "ready_seconds": None,
        "api": None,
        "served_model": None,
        "stages_reached": [],
        "interrupted_by": None,
        "attached": {"at": attached.isoformat(), "log": None, "server_exited": False},
    }


def run_attach(
    opts: AttachOptions,
    *,
    say: Callable[[str], None],
    nvml: object = None,
    container_root: str = "/",
) -> runmod.CaptureResult:
    """Write the bundle of the running server ``opts.pid``; never signals it."""
    info = read_process(opts.pid)
    if opts.log not in (None, "-") and not Path(str(opts.log)).is_file():
        raise UsageError(f"--log {opts.log}: no such file; give the server's log file or '-'")
    attached = datetime.now(UTC)
    cap = replace(opts.capture, argv=info.argv, stop_after_request=False, analyze=True)
    # Our own staging folder and a bundle name nobody else takes (docs/security.md).
    output, staging = reserve_staging(cap.output, cap.staging, attached)
    grp = capture_group.resolve(cap.group, list(info.argv), info.env)
    redactor = runmod._new_redactor()
    writer = runmod._open_writer(staging, redactor)
    run = runmod._Run(cap, say, writer=writer, redactor=redactor, argv=info.argv, env=info.env)
    run.server_pid = opts.pid  # readiness: the listener must belong to this process tree
    if grp is not None:
        runmod._safe(run, "manifest group", lambda: writer.set_group(grp.to_json()))
    for problem in info.problems:
        writer.add_not_collected("environment", problem)
    redactor.env(info.env, where="environment")
    launch = run.launch
    launch |= _launch(info, opts.pid, list(redactor.argv(list(info.argv))), attached)
    launch["attached"]["log"] = opts.log
    run.notes |= {
        "schema": runmod.NOTES_SCHEMA,
        "notes": list(cap.notes),
        "changes": [],
        "cluster": {"gpu_processes": [], "text": cap.cluster_text},
    }
    run.serve = runmod._serve_info(info.argv)
    if cap.url or run.serve is not None:
        run.target = probe.api_target(list(info.argv), info.env, cap.url)
        launch["api"] = run.target.to_json()
    runmod._safe(run, "launch.json", lambda: writer.write_json("launch.json", launch))
    say(f"attached to pid {opts.pid} ({' '.join(info.argv[:3])} …); writing {output}")
    return _follow_and_finish(
        run,
        opts=opts,
        output=output,
        staging=staging,
        grp=grp,
        nvml=nvml,
        container_root=container_root,
    )


def _follow_and_finish(
    run: runmod._Run,
    *,
    opts: AttachOptions,
    output: Path,
    staging: Path,
    grp: capture_group.GroupInfo | None,
    nvml: Any,
    container_root: str,
) -> runmod.CaptureResult:
    writer, launch = run.writer, run.launch
    recorder = LineRecorder(
        writer.open_stream("logs/combined.log"),
        writer.open_stream("logs/lines.tsv"),
        redact=runmod.LogRedactor(run.redactor, runmod.known_secrets(run.env, run.argv)),
        on_first_loss=run.say,
    )
    follower = LogFollower(opts.log, recorder) if opts.log else None
    if follower is not None:
        follower.start()
    else:
        writer.add_not_collected("logs/combined.log", "no --log given when attaching")
    run.started_mono = time.monotonic()
    fp_thread = threading.Thread(
        target=runmod._fingerprint_worker, args=(run, nvml, container_root), daemon=True
    )
    fp_thread.start()
    scanner = LibraryScanner(opts.pid, interval=run.opts.scan_interval)
    scanner.start()
    interrupted = _wait(run, opts, follower)
    if follower is not None:
        follower.stop()
        if follower.error:
            writer.add_not_collected("logs/combined.log", follower.error)
    recorder.close(600)
    scanner.stop()
    run.fp.libraries.extend(lib.to_json() for lib in scanner.libraries())
    fp_thread.join(run.opts.python_timeout + 10)
    runmod._safe(
        run, "fingerprint.json", lambda: writer.write_json("fingerprint.json", run.fp.to_json())
    )
    exited = not alive(opts.pid)
    launch["attached"]["server_exited"] = exited
    launch["interrupted_by"] = interrupted
    rd = run.readiness
    if rd is not None:
        launch["served_model"] = rd.served_model
        if rd.error:
            launch["ready_error"] = rd.error
    analysis = runmod._analyze(run, writer, staging)
    launch["stages_reached"] = runmod._stages_reached(analysis, run)
    runmod._safe(run, "launch.json", lambda: writer.write_json("launch.json", launch))
    for loss in recorder.losses:
        runmod._record_loss(writer, loss.to_json())
    if grp is not None:
        g = capture_group.with_end_sample(grp)
        runmod._safe(run, "manifest group", lambda: writer.set_group(g.to_json()))
    summary = runmod._summary(run, launch, analysis, recorder.lines_written)
    bundle = Path(writer.finalize(output))
    ff = (analysis or {}).get("first_failure")
    status = 3 if ff else 0
    return runmod.CaptureResult(
        status,
        bundle,
        staging,
        summary,
        None,
        ff if isinstance(ff, dict) else None,
        tuple(run.problems),
    )


def _wait(run: runmod._Run, opts: AttachOptions, follower: LogFollower | None) -> str | None:
    """Until the requests are done and ``follow`` s more have passed, the server exited, the
    piped log ended, or Ctrl-C. Returns the signal name that ended it, if any."""
    got: list[str] = []
    old: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, lambda s, _f: got.append(signal.Signals(s).name))
    prober = None
    if run.target is not None:
        prober = threading.Thread(target=runmod._probe_worker, args=(run,), daemon=True)
        prober.start()
    done_at: float | None = None
    try:
        while not got:
            if not alive(opts.pid):
                run.child_exited.set()
                run.say(f"pid {opts.pid} exited; finishing the bundle")
                break
            if follower is not None and follower.eof.is_set():
                break
            if done_at is None and (prober is None or not prober.is_alive()):
                done_at = time.monotonic()
            if done_at is not None and time.monotonic() - done_at >= opts.follow:
                break
            time.sleep(_POLL_S)  # the server is not our child: no wait() to block on
    finally:
        run.stop.set()
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if prober is not None:
        prober.join(30)
    return got[0] if got else None
