"""``kk3evidence capture``: run a command unchanged and record it into an evidence bundle.

What happens, in order (docs/capture.md is the user's page):

1. A staging folder is created beside the bundle and ``launch.json``/``notes.json`` are written
   at once, so a capture that is killed still leaves something ``kk3evidence seal`` can use.
2. CMD starts in its own process group with two pipes. A pump thread passes its stdout and
   stderr through byte-exact as soon as they arrive; a writer thread appends whole lines with
   their receive times to ``logs/combined.log`` and ``logs/lines.tsv`` (:mod:`._pump`).
   SIGINT, SIGTERM and SIGHUP are forwarded to CMD's group; a second Ctrl-C kills the group.
3. Beside it, without delaying the start: the fingerprint (host, GPUs through NVML, container,
   the served program's Python side in a subprocess, selected environment), a periodic scan of
   the libraries the process tree maps (:mod:`._procscan`), and, for an HTTP server, readiness
   polling, the fixed request(s), ``/metrics`` before and after and the prefix probe
   (:mod:`.probe`).
4. When CMD exits: its group gets a short grace period, the log is flushed, the run is analyzed
   (``analysis.json``), and the staging folder becomes the bundle. Capture returns CMD's exit
   status (128+N when a signal N killed it).

Secrets are redacted before anything is written (argv, environment, request headers, log
text); the terminal still sees CMD's output unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kk3evidence._literals import LiteralScanner
from kk3evidence.analysis.engine_config import engine_numbers
from kk3evidence.bundle.ledger import Ledger
from kk3evidence.capture import fingerprint as fpmod
from kk3evidence.capture import group as capture_group
from kk3evidence.capture import http as probe
from kk3evidence.capture import identity, raylogs
from kk3evidence.capture.procscan import LibraryScanner, group_members
from kk3evidence.capture.pump import LineRecorder, Pump
from kk3evidence.capture.staging import default_output, staging_for  # noqa: F401 (re-exported)
from kk3evidence.capture.staging import reserve as reserve_staging
from kk3evidence.capture.watchdog import (
    StallPolicy,
    StopRecord,
    Watchdog,
    escalate,
    prepare_watchdog,
    start_watchdog,
)
from kk3evidence.errors import CaptureError, InputError, Kk3Error, UsageError
from kk3evidence.model import FORMAT_IDS, STAGES, JSONObject

if TYPE_CHECKING:
    from kk3evidence.analysis.progress import MilestoneWatcher
    from kk3evidence.bundle.redact import Redactor

LOG_MEMBER = "logs/combined.log"
LAUNCH_SCHEMA = FORMAT_IDS["launch"]
NOTES_SCHEMA = FORMAT_IDS["notes"]
PREFIX_PROBE_SCHEMA = FORMAT_IDS["prefix-probe"]

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


# ------------------------------------------------------------------------------ notes options
@dataclass(frozen=True, slots=True)
class Change:
    """``--change 'driver=570.86.15->580.65.06[@2026-11-29T10:00:00Z]'``."""

    variable: str
    from_value: str | None
    to_value: str | None
    at: str | None

    def to_json(self) -> JSONObject:
        return {
            "variable": self.variable,
            "from": self.from_value,
            "to": self.to_value,
            "at": self.at,
        }


_CHANGE_RE = re.compile(r"^\s*(?P<var>[^=]+?)\s*=\s*(?P<from>.*?)\s*->\s*(?P<to>.*?)\s*$")


def parse_change(text: str, default_at: str | None = None) -> Change:
    """Parse ``VAR=FROM->TO`` with an optional ``@WHEN`` (ISO date or date-time) at the end."""
    body, at = text, default_at
    if "@" in text:
        head, _, when = text.rpartition("@")
        parsed = _parse_when(when.strip())
        if parsed is not None:
            body, at = head, parsed
    m = _CHANGE_RE.match(body)
    if m is None or not m.group("var"):
        raise UsageError(
            f"--change {text!r}: expected 'VARIABLE=FROM->TO' (optionally '@2026-11-29T10:00Z'), "
            "e.g. --change 'driver=570.86.15->580.65.06'"
        )
    return Change(m.group("var"), m.group("from") or None, m.group("to") or None, at)


def _parse_when(when: str) -> str | None:
    try:
        dt = datetime.fromisoformat(when.replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.isoformat()


# ---------------------------------------------------------------------------------- options
@dataclass(frozen=True, slots=True)
class CaptureOptions:
    argv: tuple[str, ...]
    output: Path | None = None
    staging: Path | None = None
    notes: tuple[str, ...] = ()
    changes: tuple[str, ...] = ()
    cluster_text: str | None = None
    image: str | None = None
    image_id: str | None = None
    probe: bool | None = None  # None: on for a vLLM server command
    url: str | None = None
    ready_timeout: float = 3600.0
    request_file: Path | None = None
    request_path: str | None = None
    repeat: int = 1
    prefix_probe: bool = False
    block_size: int | None = None
    stop_after_request: bool = False
    request_timeout: float = 300.0
    probe_timeout: float = 10.0
    python_timeout: float = 120.0
    grace: float = 10.0
    analyze: bool = True
    scan_interval: float = 2.0
    extra_env: Mapping[str, str] = field(default_factory=dict)
    preflight: bool = False  # run `preflight` first and store preflight.json
    preflight_recipe: str | None = None
    group: str | None = None  # --group ID|auto (None: derived only for a multi-node launch)
    #: the stall watchdog and ready timeout (capture/watchdog.py); StallPolicy(stall_after=0)
    #: with no ready_timeout turns it off
    stall: StallPolicy = field(default_factory=StallPolicy)


@dataclass(frozen=True, slots=True)
class CaptureResult:
    exit_status: int
    bundle: Path | None
    staging: Path
    summary: str
    ready_seconds: float | None
    first_failure: dict[str, Any] | None
    problems: tuple[str, ...] = ()


# ------------------------------------------------------------------------ bundle adapters
def _open_writer(staging: Path, redactor: Any) -> Any:
    from kk3evidence.bundle.archive import BundleWriter

    return BundleWriter(staging, redactor=redactor)


def _new_redactor() -> Redactor:
    from kk3evidence.bundle.redact import Redactor

    return Redactor.with_user_key()


#: lower-case literals capture's pre-filter looks for besides ``Redactor.anchors`` (most are
#: among them; ``_token``/``-token`` are not, and are kept so the same lines reach the Redactor)
_REDACT_ANCHORS: tuple[bytes, ...] = (
    b"hf_",
    b"sk-",
    b"ghp_",
    b"gho_",
    b"ghu_",
    b"ghs_",
    b"ghr_",
    b"github_pat_",
    b"eyj",
    b"akia",
    b"asia",
    b"secret",
    b"authorization",
    b"bearer",
    b"://",
    b"passw",
    b"pwd",
    b"api_key",
    b"api-key",
    b"apikey",
    b"_token",
    b"-token",
    b"private_key",
    b"private-key",
)


@functools.cache
def _pattern_anchors() -> tuple[bytes, ...]:
    """The Redactor's anchor literals (lower-case) and ours above, sorted."""
    from kk3evidence.bundle.redact import Redactor

    return tuple(sorted(set(Redactor.anchors) | set(_REDACT_ANCHORS)))


def _anchor_scan(known: Sequence[bytes]) -> Callable[[bytes | memoryview], list[tuple[int, int]]]:
    """Where any anchor (any case) or known secret (exact) occurs in a buffer: ``(end offset,
    id)`` of the first occurrence of each (``LiteralScanner.hits``: Hyperscan, about 3 GB/s,
    when it is installed). The bound method itself: it runs on every line near a hit."""
    anchors = _pattern_anchors()
    scanner = LiteralScanner(
        anchors + tuple(known),
        single=[True] * (len(anchors) + len(known)),
        caseless=[True] * len(anchors) + [False] * len(known),
    )
    scanner.engine  # noqa: B018 - compiled now, not on the first log block
    return scanner.hits


class LogRedactor:
    """Redacts log blocks with ``redact.Redactor``, but only the lines that can hold a secret.

    The Redactor's full pattern set costs about half a microsecond per byte; a block of log
    lines is first searched (at C speed) for the literals every pattern needs and for the
    secret values already known (from the environment, argv, headers and earlier log lines,
    with their JSON-escaped and URL-quoted spellings), and only the lines around a hit go
    through the Redactor. Same result, orders of magnitude faster on ordinary logs.
    """

    def __init__(self, redactor: Redactor, known: Sequence[bytes] = ()) -> None:
        self._redactor = redactor
        self._extra = tuple(known)
        self._learned = -1
        self._anchors = self._build()

    def _build(self) -> Callable[[bytes | memoryview], list[tuple[int, int]]]:
        values = set(self._extra) | set(self._redactor.known_values())
        self._learned = self._redactor.learned
        return _anchor_scan(tuple(sorted(v for v in values if len(v) >= 6)))

    def safe_cut(self, data: bytes) -> int:
        """Where a long unfinished line may be cut without cutting a secret (pump.py)."""
        return self._redactor.safe_cut(data)

    def __call__(self, data: bytes | memoryview) -> bytes | memoryview:
        in_block = self._redactor.in_block
        hits = self._anchors(data)
        if not hits and not in_block:
            return data
        block = bytes(data)
        first = 0 if in_block else block.rfind(b"\n", 0, min(hits)[0] - 1) + 1
        if not in_block:
            # Known secrets first, over the whole block at C speed (a flood of lines carrying
            # one keeps up); only lines with an anchor outside a placeholder go on.
            block = self._redactor.replace_known(block, where=LOG_MEMBER)
            if not self._anchors(_unplaced(block)):
                return block
            first = 0
        # A hit anywhere: every line of the block from the first hit's line on goes through the
        # Redactor line by line, except lines that are plainly clean (checked per line).
        out: list[bytes] = []
        out.append(block[:first])
        for line in block[first:].split(b"\n"):
            if line and (self._anchors(_unplaced(line)) or self._redactor.in_block):
                out.append(self._redactor.text(line, where=LOG_MEMBER))
                if self._redactor.learned != self._learned:
                    # A secret learned from this line: look for it from the next line on.
                    self._anchors = self._build()
            else:
                out.append(line)
            out.append(b"\n")
        out.pop()
        return b"".join(out)


def _unplaced(data: bytes) -> bytes:
    """``data`` without the placeholders already in it (their labels hold anchors)."""
    from kk3evidence.bundle.redact import PLACEHOLDER_RE

    return PLACEHOLDER_RE.sub(b"", data) if b"<redacted:" in data else data


def known_secrets(env: Mapping[str, str], argv: Sequence[str]) -> list[bytes]:
    """Secret values from the environment and argv (what ``Redactor`` learns from them)."""
    from kk3evidence.bundle.redact import is_secret_flag, is_secret_name

    values = [v for k, v in env.items() if is_secret_name(k)]
    for i, arg in enumerate(argv):
        if arg.startswith("-") and "=" in arg:
            flag, _, value = arg.partition("=")
            if is_secret_flag(flag):
                values.append(value)
        elif is_secret_flag(arg) and i + 1 < len(argv):
            values.append(argv[i + 1])
    trivial = {"", "0", "1", "true", "false", "yes", "no", "none", "null"}
    return sorted(
        {v.encode("utf-8", "surrogateescape") for v in values if v.strip().lower() not in trivial}
    )


# ------------------------------------------------------------------------------- the run
class _Run:
    """State shared by the threads of one capture."""

    def __init__(
        self,
        opts: CaptureOptions,
        say: Callable[[str], None],
        *,
        writer: Any,
        redactor: Any,
        argv: Sequence[str],
        env: Mapping[str, str],
    ) -> None:
        self.opts = opts
        self.say = say
        self.writer = writer
        self.redactor = redactor
        self.argv = list(argv)
        self.env = dict(env)
        self.fp = fpmod.Fingerprint()
        self.serve: Any = None
        self.request_body: Any = None
        self.notes: dict[str, Any] = {}
        self.launch: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.child_exited = threading.Event()
        self.stop = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None
        self.pgid: int | None = None
        # a server we did not start (capture --attach): whose listener readiness accepts
        self.server_pid: int | None = None
        self.started_mono = 0.0
        self.signals: list[int] = []
        self.early_signals: list[int] = []
        self.interrupted_by: str | None = None
        self.stopped_by: str | None = None
        self.readiness: probe.Readiness | None = None
        self.requests: list[dict[str, Any]] = []
        self.prefix: dict[str, Any] | None = None
        self.target: probe.ApiTarget | None = None
        self.problems: list[str] = []
        self.stop_record: StopRecord | None = None
        self.stall_docs: list[dict[str, Any]] = []

    # signals -------------------------------------------------------------------------------
    def on_signal(self, signum: int, _frame: object) -> None:
        self.signals.append(signum)
        if self.interrupted_by is None:
            self.interrupted_by = signal.Signals(signum).name
        if self.pgid is None:
            self.early_signals.append(signum)  # sent on as soon as the group exists
            return
        stops = sum(1 for s in self.signals if s in (signal.SIGINT, signal.SIGTERM))
        if signum in (signal.SIGINT, signal.SIGTERM) and stops >= 2:
            # A command that ignores the first one must not keep capture waiting.
            name = signal.Signals(signum).name
            said = "Ctrl-C" if signum == signal.SIGINT else name
            self.say(f"second {said}: killing the command's process group (SIGKILL)")
            self.stop_record = self.stop_record or StopRecord(f"{name} to capture, twice")
            self.stop_record.sent.append({"signal": "SIGKILL"})
            self.stop_record.ended_by = "SIGKILL"
            self.kill_group(signal.SIGKILL)
        else:
            self.kill_group(signum)
            name = signal.Signals(signum).name
            hint = "; Ctrl-C again kills its process group" if signum == signal.SIGINT else ""
            self.say(f"{name} forwarded to the command{hint}")

    def kill_group(self, signum: int) -> bool:
        if self.pgid is None:
            return False
        try:
            os.killpg(self.pgid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def group_alive(self) -> bool:
        if self.pgid is None:
            return False
        members = group_members(self.pgid)
        if members is not None:  # zombies (an init that does not reap) do not count
            return bool(members)
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True



def _serve_info(argv: Sequence[str]) -> Any:
    try:
        from kk3evidence.vllm_args import parse_serve_argv

        return parse_serve_argv(list(argv))
    except Exception:
        return None


def _wait_interruptibly(proc: subprocess.Popen[bytes]) -> int:
    """Wait for CMD while staying responsive to forwarded signals.

    A signal sent to this process may be delivered by the kernel to any of its threads (the
    pump, the prober); Python then runs our handler only when the *main* thread next executes
    bytecode. A plain ``proc.wait()`` blocks the main thread in waitpid(2), which that signal
    does not interrupt, so the handler (which forwards the signal to CMD) would wait for CMD to
    exit by itself: a deadlock with a server that only stops on that signal. Short timed waits
    let the handler run within a fraction of a second.
    """
    while True:
        try:
            return proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            continue


# Phases of run_capture, in order: _begin (staging folder, launch.json and notes.json),
# _open_recording (the log writer), _run_cmd (CMD and the helpers beside it, until it exits),
# _collect_helpers (join them, fingerprint.json), _record_exit (launch.json's outcome fields),
# _finish (analysis, last members, the bundle). The small records below carry state between them.
@dataclass(frozen=True, slots=True)
class _Hooks:
    """run_capture's callers' ends: CMD's output sinks, capture's messages, NVML, the progress."""

    out: Callable[[bytes], None]
    err: Callable[[bytes], None]
    nvml: Any
    container_root: str
    progress: Callable[[str], None] | None


@dataclass(frozen=True, slots=True)
class _Setup:
    """What :func:`_begin` prepared: the shared state and where the bundle goes."""

    run: _Run
    output: Path
    staging: Path
    created: datetime
    grp: capture_group.GroupInfo | None


@dataclass(frozen=True, slots=True)
class _Recording:
    """The log writer and its running totals (seal reads the ledger if capture is killed)."""

    recorder: LineRecorder
    redact: LogRedactor
    ledger: Ledger


@dataclass(frozen=True, slots=True)
class _Started:
    """CMD and what runs beside it until it exits."""

    proc: subprocess.Popen[bytes]
    pump: Pump
    fp_thread: threading.Thread
    scanner: LibraryScanner
    prober: threading.Thread | None
    dog: Watchdog | None


@dataclass(frozen=True, slots=True)
class _Ended:
    """CMD has exited (its group settled, the pump drained)."""

    started: _Started
    returncode: int
    ended: datetime


def run_capture(
    opts: CaptureOptions,
    *,
    out: Callable[[bytes], None],
    err: Callable[[bytes], None],
    say: Callable[[str], None],
    nvml: object = None,
    container_root: str = "/",
    progress: Callable[[str], None] | None = None,
) -> CaptureResult:
    """Run ``opts.argv`` and write the bundle. ``out``/``err`` receive CMD's raw output;
    ``say`` receives capture's own one-line messages, ``progress`` the live progress line.
    Returns CMD's exit status."""
    setup = _begin(opts, say)
    rec = _open_recording(setup)
    milestones = prepare_watchdog()
    hooks = _Hooks(out, err, nvml, container_root, progress)
    ended = _run_cmd(setup, rec, hooks, milestones)
    if isinstance(ended, CaptureResult):  # CMD could not be started
        return ended
    _collect_helpers(setup.run, rec, ended.started)
    status = _record_exit(setup.run, ended)
    return _finish(setup, rec, ended, status)


def _begin(opts: CaptureOptions, say: Callable[[str], None]) -> _Setup:
    """Check the options, create the staging folder and write launch.json and notes.json."""
    argv = list(opts.argv)
    if not argv:
        raise UsageError(
            "capture: no command given; usage: kk3evidence capture [OPTIONS] -- CMD..."
        )
    if opts.repeat < 1:
        raise UsageError("--repeat must be at least 1")
    env = dict(os.environ)
    env.update(opts.extra_env)
    created = datetime.now(UTC)
    request_body = _load_request(opts.request_file) if opts.request_file else None
    changes = [parse_change(c, created.isoformat()) for c in opts.changes]
    # Our own staging folder, created now (parallel captures never share one).
    output, staging = reserve_staging(opts.output, opts.staging, created)
    grp = capture_group.resolve(opts.group, argv, env)

    redactor = _new_redactor()
    try:
        writer = _open_writer(staging, redactor)
    except OSError as exc:
        raise CaptureError(f"cannot create the staging folder {staging}: {exc.strerror}") from exc
    run = _Run(opts, say, writer=writer, redactor=redactor, argv=argv, env=env)
    if grp is not None:
        _safe(run, "manifest group", lambda: writer.set_group(grp.to_json()))
    run.request_body = request_body

    # Learn every secret first (the whole environment, argv), so log lines that echo one are
    # redacted from the first byte on.
    redactor.env(env, where="environment")
    shown_argv = list(redactor.argv(argv))
    run.serve = _serve_info(argv)
    run.target = _api_target(run)
    _first_members(run, created, changes, shown_argv)
    say(
        f"capturing into {output} (staging folder {staging}; if capture is killed: "
        f"kk3evidence seal {staging} -o {output})"
    )
    return _Setup(run, output, staging, created, grp)


def _api_target(run: _Run) -> probe.ApiTarget | None:
    """The API to poll and probe: on for a vLLM server command or --url, unless told."""
    opts, serve = run.opts, run.serve
    # a --headless node of a multi-node launch serves no API: nothing to poll
    headless = serve is not None and serve.flags.get("headless") is True
    want_probe = (
        opts.probe
        if opts.probe is not None
        else ((serve is not None and not headless) or bool(opts.url))
    )
    return probe.api_target(run.argv, run.env, opts.url) if want_probe else None


def _first_members(
    run: _Run, created: datetime, changes: Sequence[Change], shown_argv: list[str]
) -> None:
    """launch.json and notes.json as they stand before CMD starts (and preflight.json)."""
    opts, writer = run.opts, run.writer
    launch: dict[str, Any] = run.launch
    launch |= {
        "schema": LAUNCH_SCHEMA,
        "argv": shown_argv,
        "cwd": os.getcwd(),
        "pid": None,
        "started_at": created.isoformat(),
        "ended_at": None,
        "exit_code": None,
        "signal": None,
        "exit_status": None,
        "ready_seconds": None,
        "api": run.target.to_json() if run.target else None,
        "served_model": None,
        "stages_reached": [],
        "interrupted_by": None,
    }
    notes: dict[str, Any] = run.notes
    notes |= {
        "schema": NOTES_SCHEMA,
        "notes": list(opts.notes),
        "changes": [c.to_json() for c in changes],
        "cluster": {"gpu_processes": [], "text": opts.cluster_text},
    }
    identity.record_port_holder(run.target, launch, run.say)
    _safe(run, "launch.json", lambda: writer.write_json("launch.json", launch))
    _safe(run, "notes.json", lambda: writer.write_json("notes.json", notes))
    if opts.preflight:
        _safe(run, "preflight.json", lambda: _preflight(run, run.argv, run.env, shown_argv))


def _open_recording(setup: _Setup) -> _Recording:
    """The log streams and the line recorder that redacts and writes them."""
    run = setup.run
    log_stream = run.writer.open_stream("logs/combined.log")
    index_stream = run.writer.open_stream("logs/lines.tsv")
    ledger = Ledger(setup.staging)  # running totals that seal reads if capture is killed
    recorder_redact = LogRedactor(run.redactor, known_secrets(run.env, run.argv))
    recorder = LineRecorder(
        log_stream,
        index_stream,
        redact=recorder_redact,
        on_first_loss=run.say,
        ledger=ledger.update,
        counters=ledger.counters,
    )
    return _Recording(recorder, recorder_redact, ledger)


def _run_cmd(
    setup: _Setup, rec: _Recording, hooks: _Hooks, milestones: MilestoneWatcher
) -> _Ended | CaptureResult:
    """Start CMD, wait for it with signals forwarded; a CaptureResult if it could not start."""
    run = setup.run
    # Hand the GIL over more often than every 5 ms so that the pump thread never waits long
    # behind the log writer (a 1 MiB pipe fills in ~3 ms during a flood).
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    old_handlers: dict[int, Any] = {}
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        for sig in FORWARDED_SIGNALS:
            old_handlers[sig] = signal.signal(sig, run.on_signal)
    try:
        try:
            proc = subprocess.Popen(
                run.argv,
                stdin=None,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=run.env,
                process_group=0,
            )
        except OSError as exc:
            rec.recorder.close(10)
            rec.ledger.close()
            return _finish_unstarted(run, setup.output, setup.staging, exc)
        started = _start_helpers(setup, rec, hooks, milestones, proc)
        return _wait_for_cmd(run, started)
    finally:
        sys.setswitchinterval(old_interval)
        if in_main:
            for signum, handler in old_handlers.items():
                signal.signal(signum, handler)


def _start_helpers(
    setup: _Setup,
    rec: _Recording,
    hooks: _Hooks,
    milestones: MilestoneWatcher,
    proc: subprocess.Popen[bytes],
) -> _Started:
    """The pump, the fingerprint, the library scanner, the prober and the watchdog."""
    run, writer, launch = setup.run, setup.run.writer, setup.run.launch
    run.proc = proc
    run.pgid = proc.pid
    run.started_mono = time.monotonic()
    launch["pid"] = proc.pid
    assert proc.stdout is not None and proc.stderr is not None
    # The pid is on disk before any output is recorded: a capture killed at any later
    # moment leaves a staging folder whose launch.json names CMD's process group.
    _safe(run, "launch.json", lambda: writer.write_json("launch.json", launch))
    pump = Pump((proc.stdout.fileno(), proc.stderr.fileno()), (hooks.out, hooks.err), rec.recorder)
    pump.start()
    if run.early_signals:  # a signal arrived before the group existed
        run.kill_group(run.early_signals[0])

    fp_thread = threading.Thread(
        target=_fingerprint_worker,
        args=(run, hooks.nvml, hooks.container_root),
        name="kk3-fingerprint",
        daemon=True,
    )
    fp_thread.start()
    scanner = LibraryScanner(proc.pid, interval=run.opts.scan_interval)
    scanner.start()
    prober: threading.Thread | None = None
    if run.target is not None:
        prober = threading.Thread(
            target=_probe_worker,
            args=(run,),
            name="kk3-prober",
            daemon=True,
        )
        prober.start()
    dog = start_watchdog(
        run,
        pump,
        milestones=milestones,
        log_path=str(setup.staging / LOG_MEMBER),
        progress=hooks.progress,
        nvml=hooks.nvml,
        stop_run=_stop_run,
    )
    return _Started(proc, pump, fp_thread, scanner, prober, dog)


def _wait_for_cmd(run: _Run, started: _Started) -> _Ended:
    """CMD's exit, then its group's (grace period) and the end of its output."""
    returncode = _wait_interruptibly(started.proc)
    run.child_exited.set()
    if started.dog is not None:
        started.dog.close()
    ended = datetime.now(UTC)
    _settle_group(run)
    pump = started.pump
    if not pump.join(run.opts.grace + 5):
        # something outside the group still holds the pipes open
        pump.stop_after(0.5)
        pump.join(5)
    return _Ended(started, returncode, ended)


def _collect_helpers(run: _Run, rec: _Recording, started: _Started) -> None:
    """Close the pipes and the log, join the helpers, write fingerprint.json."""
    proc, fp = started.proc, run.fp
    for pipe in (proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):
            if pipe is not None:
                pipe.close()
    if not rec.recorder.close(600):
        run.problems.append("the log writer did not finish within 600 s")
    rec.ledger.close()
    run.stop.set()
    if started.prober is not None:
        started.prober.join(30)
    scanner = started.scanner
    scanner.stop()
    for lib in scanner.libraries():
        fp.libraries.append(lib.to_json())
    if scanner.errors:
        fp.probes.append(fpmod.ProbeRecord("libraries", False, 0.0, "; ".join(scanner.errors)))
    else:
        fp.probes.append(
            fpmod.ProbeRecord("libraries", True, 0.0, None)
            if scanner.scans
            else fpmod.ProbeRecord(
                "libraries", False, 0.0, "the process exited before the first scan"
            )
        )
    started.fp_thread.join(run.opts.python_timeout + 10)
    writer = run.writer
    _safe(run, "fingerprint.json", lambda: writer.write_json("fingerprint.json", fp.to_json()))
    if started.fp_thread.is_alive():
        writer.add_not_collected("fingerprint (python side)", "probe still running at the end")


def _record_exit(run: _Run, ended: _Ended) -> int:
    """launch.json's outcome fields; returns capture's exit status (128+N for signal N)."""
    launch, returncode = run.launch, ended.returncode
    if returncode < 0:
        launch["signal"] = -returncode
        launch["exit_code"] = None
        status = 128 - returncode
    else:
        launch["exit_code"] = returncode
        status = returncode
    launch["exit_status"] = status
    launch["ended_at"] = ended.ended.isoformat()
    launch["interrupted_by"] = run.interrupted_by
    if run.stopped_by:
        launch["stopped_by"] = run.stopped_by
    if run.stop_record is not None:
        launch["stop"] = run.stop_record.to_json()
    dog = ended.started.dog
    if dog is not None and dog.snapshots:
        launch["stalls"] = list(dog.snapshots)
    rd = run.readiness
    if rd is not None:
        launch["ready_seconds"] = round(rd.seconds, 3) if rd.seconds is not None else None
        launch["served_model"] = rd.served_model
        if rd.error:
            launch["ready_error"] = rd.error
    elif run.target is not None:
        launch["ready_error"] = "api_ready not reached: not polled"
    if ended.started.pump.sink_errors:
        launch["passthrough_errors"] = ended.started.pump.sink_errors
    return status


def _finish(setup: _Setup, rec: _Recording, ended: _Ended, status: int) -> CaptureResult:
    """Analyze the log, write the last members and turn the staging folder into the bundle."""
    run, writer, launch = setup.run, setup.run.writer, setup.run.launch
    ray_logs = raylogs.capture_hook(
        writer, rec.redact, run.argv, run.env, setup.created.timestamp()
    )
    analysis_json: dict[str, Any] | None = None
    if run.opts.analyze:
        analysis_json = _analyze(run, writer, setup.staging)
    if analysis_json is not None and ray_logs:
        analysis_json["extra_logs"] = raylogs.analyse_extra(ray_logs)
        _safe(run, "analysis.json", lambda: writer.write_json("analysis.json", analysis_json))
    launch["stages_reached"] = _stages_reached(analysis_json, run)
    if run.prefix is not None:
        _finish_prefix_checks(run.prefix, analysis_json)
        _safe(
            run,
            "probes/prefix_probe.json",
            lambda: writer.write_json("probes/prefix_probe.json", run.prefix),
        )
    _safe(run, "launch.json", lambda: writer.write_json("launch.json", launch))
    for loss in rec.recorder.losses:
        _record_loss(writer, loss.to_json())

    grp = setup.grp
    if grp is not None:
        _safe(
            run,
            "manifest group",
            lambda: writer.set_group(capture_group.with_end_sample(grp).to_json()),
        )
    summary = _summary(run, launch, analysis_json, rec.recorder.lines_written)
    output, staging = setup.output, setup.staging
    bundle: Path | None = None
    try:
        bundle = Path(writer.finalize(output))
    except Exception as exc:
        run.problems.append(
            f"could not write the bundle {output} ({type(exc).__name__}: {exc}); "
            f"what was captured is in {staging}: run 'kk3evidence seal {staging} -o {output}' "
            "once there is room"
        )
    ff = analysis_json.get("first_failure") if analysis_json else None
    return CaptureResult(
        exit_status=status,
        bundle=bundle,
        staging=staging,
        summary=summary,
        ready_seconds=launch["ready_seconds"],
        first_failure=ff if isinstance(ff, dict) else None,
        problems=tuple(run.problems),
    )


def _preflight(run: _Run, argv: list[str], env: dict[str, str], shown: list[str]) -> None:
    from kk3evidence.capture.preflight_host import preflight_member

    doc, line = preflight_member(argv, env, shown, run.redactor.text, run.opts.preflight_recipe)
    run.say(line)
    run.writer.write_json("preflight.json", doc)


def _safe(run: _Run, what: str, fn: Callable[[], Any]) -> None:
    """A write error on one member is recorded and never stops the capture."""
    try:
        fn()
    except (OSError, ValueError, TypeError, Kk3Error) as exc:
        msg = f"could not write {what}: {type(exc).__name__}: {exc}"
        if msg not in run.problems:
            run.problems.append(msg)
            run.say(msg)


def _record_loss(writer: Any, loss: dict[str, Any]) -> None:
    add = getattr(writer, "add_loss", None)
    with contextlib.suppress(Exception):
        if callable(add):
            add(loss["member"], loss["reason"], bytes=loss["bytes"], lines=loss["lines"])
        else:
            writer.add_not_collected(
                f"{loss['member']}: {loss['bytes']} bytes, {loss['lines']} lines", loss["reason"]
            )


def _load_request(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"--request {path}: cannot read it ({exc.strerror})") from exc
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"--request {path}: not JSON (line {exc.lineno} column {exc.colno}: {exc.msg}); "
            'give the request body, e.g. {"messages": [...], "max_tokens": 16}'
        ) from exc
    if not isinstance(body, dict):
        raise InputError(f"--request {path}: the request body must be a JSON object")
    return body


def _finish_unstarted(run: _Run, output: Path, staging: Path, exc: OSError) -> CaptureResult:
    writer, redactor, launch, argv = run.writer, run.redactor, run.launch, run.argv
    status = 127 if isinstance(exc, FileNotFoundError) else 126
    reason = f"cannot run {argv[0]}: {exc.strerror or exc}"
    launch.update(
        {"ended_at": now_iso(), "exit_status": status, "exit_code": None, "start_error": reason}
    )
    run.say(reason)
    _safe(run, "launch.json", lambda: writer.write_json("launch.json", launch))
    fp = fpmod.Fingerprint()
    fpmod.collect_base(fp, run.env, timeout=run.opts.probe_timeout)
    fp.env = dict(redactor.env(fpmod.select_env(run.env)))
    _safe(run, "fingerprint.json", lambda: writer.write_json("fingerprint.json", fp.to_json()))
    bundle: Path | None = None
    try:
        bundle = Path(writer.finalize(output))
    except Exception as err:
        run.problems.append(f"could not write the bundle: {err}")
    return CaptureResult(status, bundle, staging, reason, None, None, tuple(run.problems))


def _settle_group(run: _Run) -> None:
    """After CMD exits: let its group (engine/worker children) end, then end it ourselves."""
    deadline = time.monotonic() + run.opts.grace
    while run.group_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not run.group_alive():
        return
    run.say(
        f"processes of the command's group still alive {run.opts.grace:g} s after it exited; "
        "sending SIGTERM"
    )
    run.kill_group(signal.SIGTERM)
    deadline = time.monotonic() + 5
    while run.group_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if run.group_alive():
        run.say("sending SIGKILL to the leftovers")
        run.kill_group(signal.SIGKILL)
    run.problems.append("the command left processes behind in its group; they were stopped")


# ---------------------------------------------------------------------------- fingerprint
def _fingerprint_worker(run: _Run, nvml: Any, container_root: str) -> None:
    opts, writer, fp, env, notes = run.opts, run.writer, run.fp, run.env, run.notes
    argv, redactor = run.argv, run.redactor
    try:
        fp.env = dict(redactor.env(fpmod.select_env(dict(env))))
        fpmod.collect_base(
            fp,
            env,
            nvml=nvml,
            image=opts.image,
            image_id=opts.image_id,
            timeout=opts.probe_timeout,
            container_root=container_root,
        )
        others = _gpu_processes(fp.gpus, run.pgid)
        notes["cluster"]["gpu_processes"] = others
        if notes["cluster"]["text"] is None:
            notes["cluster"]["text"] = _cluster_text(fp.gpus, others)
        _safe(run, "notes.json", lambda: writer.write_json("notes.json", notes))
        _safe(run, "fingerprint.json", lambda: writer.write_json("fingerprint.json", fp.to_json()))
        fp.python, rec = fpmod.collect_python(argv, env, opts.python_timeout)
        fp.probes.append(rec)
        _safe(run, "fingerprint.json", lambda: writer.write_json("fingerprint.json", fp.to_json()))
    except Exception as exc:
        fp.probes.append(
            fpmod.ProbeRecord("fingerprint", False, 0.0, f"{type(exc).__name__}: {exc}")
        )


def _gpu_processes(gpus: Mapping[str, Any], own_group: int | None) -> list[dict[str, Any]]:
    """Processes on the GPUs at the start that are not ours: the "other jobs" evidence."""
    out: list[dict[str, Any]] = []
    for dev in gpus.get("devices") or []:
        for p in dev.get("processes") or []:
            if own_group is not None and _in_group(p.get("pid"), own_group):
                continue
            out.append({"gpu_index": dev.get("index"), "gpu_uuid": dev.get("uuid"), **p})
    return out


def _in_group(pid: Any, pgid: int) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        return os.getpgid(pid) == pgid
    except OSError:
        return False


def _cluster_text(gpus: Mapping[str, Any], others: list[dict[str, Any]]) -> str:
    if gpus.get("source") != "nvml":
        return f"GPU state unknown (NVML: {gpus.get('error') or gpus.get('source')})"
    n = len(gpus.get("devices") or [])
    if not others:
        return f"no other processes on the {n} GPU(s) at the start"
    used = sum(p.get("used_memory_bytes") or 0 for p in others)
    on = sorted({str(p.get("gpu_index")) for p in others})
    return (
        f"{len(others)} other process(es) on GPU(s) {', '.join(on)} at the start, "
        f"using {used / 2**30:.1f} GiB"
    )


# ---------------------------------------------------------------------------------- HTTP
def _probe_worker(run: _Run) -> None:
    try:
        _probe(run)
    except Exception as exc:
        run.problems.append(f"HTTP probe failed: {type(exc).__name__}: {exc}")


@dataclass(frozen=True, slots=True)
class _Http:
    client: Any
    target: probe.ApiTarget
    headers: Mapping[str, str]  # sent
    shown: Mapping[str, str]  # recorded (redacted)
    auth: Mapping[str, str]  # for GET /v1/models and /metrics


def _probe(run: _Run) -> None:
    opts, writer, redactor, request_body = run.opts, run.writer, run.redactor, run.request_body
    target = run.target
    assert target is not None
    headers = {"Content-Type": "application/json"}
    if target.api_key:
        headers["Authorization"] = f"Bearer {target.api_key}"
    shown = dict(redactor.headers(headers))
    auth = {k: v for k, v in headers.items() if k == "Authorization"}
    with probe.make_client() as client:
        rd = probe.wait_ready(
            client,
            target,
            started_mono=run.started_mono,
            timeout=opts.ready_timeout,
            alive=lambda: not run.child_exited.is_set(),
            stop=run.stop,
            headers=auth,
            verify=identity.verifier(target.host, target.port,
                                     lambda: run.proc.pid if run.proc else run.server_pid,
                                     identity.expected_models(run.serve)),
        )
        run.readiness = rd
        if not rd.ready:
            if not run.child_exited.is_set():
                run.say(rd.error or "api_ready not reached")
            return
        run.say(f"api ready in {rd.seconds:.1f} s at {target.base_url} (model {rd.served_model})")
        before, merr = probe.fetch_metrics(client, target, auth)
        _save_metrics(run, writer, "before", before, merr)
        body = dict(request_body) if request_body is not None else probe.default_request_body(None)
        if body.get("model") is None:
            body["model"] = rd.served_model
        path = opts.request_path or (
            "/v1/chat/completions"
            if "messages" in body or "prompt" not in body
            else "/v1/completions"
        )
        url = target.base_url + path
        for i in range(1, opts.repeat + 1):
            if run.child_exited.is_set():
                break
            name = f"fixed-{i}"
            rec = probe.send_request(
                client,
                name=name,
                kind="fixed" if request_body is None else "custom",
                url=url,
                body=body,
                headers=headers,
                shown_headers=shown,
                timeout=opts.request_timeout,
            )
            run.requests.append(rec)
            _save_request(run, rec)
            run.say(_request_line(rec))
        if opts.prefix_probe and not run.child_exited.is_set():
            http = _Http(client, target, headers, shown, auth)
            run.prefix = _prefix_probe(run, http, rd, before)
            _safe(
                run,
                "probes/prefix_probe.json",
                lambda: writer.write_json("probes/prefix_probe.json", run.prefix),
            )
        after, merr = probe.fetch_metrics(client, target, auth)
        _save_metrics(run, writer, "after", after, merr)
    if not opts.stop_after_request and not run.child_exited.is_set() and run.pgid is not None:
        run.say("requests done; the server keeps running (Ctrl-C stops it and ends the capture)")
    if opts.stop_after_request and not run.child_exited.is_set():
        run.stopped_by = "stop-after-request"
        run.say("stopping the server (--stop-after-request): SIGINT to its process group")
        run.kill_group(signal.SIGINT)
        for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            if run.child_exited.wait(wait):
                return
            run.say(f"still running; sending {sig.name}")
            run.kill_group(sig)


def _save_request(run: _Run, rec: dict[str, Any]) -> None:
    member = f"requests/{rec['name']}.json"
    for key in ("request_body", "response_body"):
        rec[key] = run.redactor.json(rec[key], where=f"{member}:{key}")
    _safe(run, member, functools.partial(run.writer.write_json, member, rec))


def _save_metrics(run: _Run, writer: Any, label: str, text: str | None, error: str | None) -> None:
    if text is not None:
        _safe(
            run,
            f"metrics/{label}.prom",
            lambda: writer.add_bytes(f"metrics/{label}.prom", text.encode("utf-8")),
        )
    else:
        with contextlib.suppress(Exception):
            writer.add_not_collected(f"metrics/{label}.prom", error or "no answer")


def _request_line(rec: Mapping[str, Any]) -> str:
    if rec.get("status") is None:
        return f"request {rec['name']}: no answer ({rec.get('error')})"
    usage = rec.get("usage") or {}
    tokens = usage.get("completion_tokens")
    extra = f", {tokens} completion tokens" if tokens is not None else ""
    return f"request {rec['name']}: HTTP {rec['status']} in {rec['latency_s']:.2f} s{extra}"


def _block_size(
    serve: Any, opts: CaptureOptions, metrics: str | None, fp: fpmod.Fingerprint
) -> tuple[int, str]:
    if opts.block_size:
        return opts.block_size, "option --block-size"
    label = probe.prom_label(metrics, "vllm:cache_config_info", "block_size")
    if label and label.isdigit():
        return int(label), "/metrics vllm:cache_config_info block_size"
    if serve is not None and getattr(serve, "block_size", None):
        return int(serve.block_size), "CMD --block-size"
    if fp.gpus.get("source") == "nvml" and fp.gpus.get("devices"):
        return 16, "default for GPUs (16)"
    return 128, "default for the CPU backend (128)"


def _prefix_probe(
    run: _Run, http: _Http, rd: probe.Readiness, before: str | None
) -> dict[str, Any]:
    """The same prompt of more than two KV blocks twice, /metrics around each: does the
    second one hit the prefix cache? (probes/prefix_probe.json)"""
    block, block_source = _block_size(run.serve, run.opts, before, run.fp)
    max_tokens = 16
    prompt = probe.prefix_probe_prompt(block, rd.max_model_len, max_tokens)
    body = {
        "model": rd.served_model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    enabled = _prefix_enabled(run.serve, before)
    recs, snaps = _send_prefix_pair(run, http, body, before)
    deltas = _prefix_deltas(snaps)
    prompt_tokens = [((r.get("usage") or {}).get("prompt_tokens")) for r in recs]
    return {
        "schema": PREFIX_PROBE_SCHEMA,
        "block_size": block,
        "block_size_source": block_source,
        "prefix_caching_enabled": enabled,
        "prompt_words": len(prompt.split()),
        "prompt_tokens": prompt_tokens,
        "exceeds_one_block": (
            None if not isinstance(prompt_tokens[0], int) else prompt_tokens[0] > block
        ),
        "deltas": deltas,
        "cached_tokens": [r.get("cached_tokens") for r in recs],
        "checks": _prefix_check_list(run, recs, deltas, enabled, prompt_tokens),
    }


def _prefix_enabled(serve: Any, before: str | None) -> bool | None:
    """Is prefix caching on: /metrics' cache_config_info first, else the command's flag."""
    enabled_label = probe.prom_label(before, "vllm:cache_config_info", "enable_prefix_caching")
    if enabled_label is not None:
        return enabled_label == "True"
    if serve is not None:
        v = serve.get("enable-prefix-caching")
        return None if v is None else bool(v)
    return None


def _send_prefix_pair(
    run: _Run, http: _Http, body: Mapping[str, Any], before: str | None
) -> tuple[list[dict[str, Any]], list[str | None]]:
    """Send ``body`` twice; returns the two records and the three /metrics snapshots."""
    client, target, auth = http.client, http.target, http.auth
    url = target.base_url + "/v1/chat/completions"
    # The first delta starts now, after the fixed request: a snapshot from before it would count
    # the fixed request's prompt in the probe's first request.
    start, merr = probe.fetch_metrics(client, target, auth)
    _save_metrics(run, run.writer, "before-prefix-1", start, merr)
    snaps: list[str | None] = [start if start is not None else before]
    recs: list[dict[str, Any]] = []
    for i in (1, 2):
        name = f"prefix-{i}"
        rec = probe.send_request(
            client,
            name=name,
            kind="prefix_probe",
            url=url,
            body=body,
            headers=http.headers,
            shown_headers=http.shown,
            timeout=run.opts.request_timeout,
        )
        recs.append(rec)
        run.requests.append(rec)
        _save_request(run, rec)
        text, merr = probe.fetch_metrics(client, target, auth)
        _save_metrics(run, run.writer, f"after-{name}", text, merr)
        snaps.append(text)
        run.say(_request_line(rec))
    return recs, snaps


def _prefix_deltas(snaps: Sequence[str | None]) -> dict[str, dict[str, float | None]]:
    """Growth of the prefix-cache query and hit counters over each of the two requests."""

    def delta(metric: str, a: int, b: int) -> float | None:
        x, y = probe.prom_value(snaps[a], metric), probe.prom_value(snaps[b], metric)
        return None if x is None or y is None else y - x

    q = "vllm:prefix_cache_queries_total"
    h = "vllm:prefix_cache_hits_total"
    return {
        "request_1": {"queries": delta(q, 0, 1), "hits": delta(h, 0, 1)},
        "request_2": {"queries": delta(q, 1, 2), "hits": delta(h, 1, 2)},
    }


def _prefix_check_list(
    run: _Run,
    recs: Sequence[Mapping[str, Any]],
    deltas: Mapping[str, Mapping[str, float | None]],
    enabled: bool | None,
    prompt_tokens: list[Any],
) -> list[dict[str, Any]]:
    """The four prefix checks; the third is decided after the run (_finish_prefix_checks)."""
    hits2 = deltas["request_2"]["hits"]
    cached2 = recs[1].get("cached_tokens")
    if hits2 is not None:
        c1 = (
            "pass" if hits2 > 0 else "fail",
            f"prefix_cache_hits_total grew by {hits2:g} on the 2nd identical request",
        )
    elif isinstance(cached2, int):
        c1 = ("pass" if cached2 > 0 else "fail", f"cached_tokens={cached2} in the 2nd response")
    else:
        c1 = ("unknown", "no prefix-cache metrics in /metrics and no cached_tokens in the response")
    same = recs[0]["request_sha256"] == recs[1]["request_sha256"]
    c2 = (
        "pass" if same else "fail",
        f"request bodies sha256 {'equal' if same else 'differ'}; prompt_tokens {prompt_tokens}",
    )
    ok_fixed = [r for r in run.requests if r["kind"] in ("fixed", "custom")]
    fixed_ok = bool(ok_fixed) and all(r.get("status") == 200 for r in ok_fixed)
    if enabled is False:
        c4 = ("not_applicable", "prefix caching is off in this run")
    elif fixed_ok:
        c4 = ("pass", "the fixed request succeeded with prefix caching on")
    else:
        c4 = (
            "unknown",
            "the fixed request did not succeed with caching on; compare with a run "
            "without --enable-prefix-caching (kk3evidence diff)",
        )
    return [
        {
            "id": "second_request_hits_cache",
            "question": "Does the 2nd identical request show cache hits?",
            "status": c1[0],
            "evidence": c1[1],
        },
        {
            "id": "inputs_identical",
            "question": "Are the 1st and 2nd requests' inputs really identical?",
            "status": c2[0],
            "evidence": c2[1],
        },
        {
            "id": "no_memory_error_after_enable",
            "question": "Is there no memory-allocation error right after enabling the cache?",
            "status": "unknown",
            "evidence": "decided after the run from the analysis",
        },
        {
            "id": "request_ok_with_cache",
            "question": "Does a request that worked without the cache work with it?",
            "status": c4[0],
            "evidence": c4[1],
        },
    ]


def _finish_prefix_checks(prefix: dict[str, Any], analysis: Mapping[str, Any] | None) -> None:
    check = next(c for c in prefix["checks"] if c["id"] == "no_memory_error_after_enable")
    if analysis is None:
        check["evidence"] = "the run was not analyzed"
        return
    bad = [
        f
        for f in analysis.get("findings") or []
        if f.get("kind") == "failure" and f.get("category") in ("oom", "kv_cache", "prefix_cache")
    ]
    if bad:
        check["status"] = "fail"
        check["evidence"] = f"line {bad[0].get('line_no')}: {str(bad[0].get('text'))[:200]}"
    else:
        check["status"] = "pass"
        check["evidence"] = "no oom/kv_cache/prefix_cache failure line in the log"


# ------------------------------------------------------------------------------ analysis
def _analyze(run: _Run, writer: Any, staging: Path) -> dict[str, Any] | None:
    log = staging / "logs" / "combined.log"
    try:
        from kk3evidence.analysis.engine import analyze
    except ImportError as exc:
        writer.add_not_collected("analysis.json", f"analysis unavailable: {exc}")
        return None
    try:
        from kk3evidence.analysis.hang import StallInputs

        inputs = StallInputs(
            launch=dict(run.launch),
            snapshots=tuple(run.stall_docs),
            lines_tsv=functools.partial(_file_blocks, staging / "logs" / "lines.tsv"),
        )
        result = analyze(str(log), stall_inputs=inputs).to_json()
    except Exception as exc:
        with contextlib.suppress(Exception):
            writer.add_not_collected("analysis.json", f"{type(exc).__name__}: {exc}")
        run.problems.append(f"analysis failed: {type(exc).__name__}: {exc}")
        return None
    result["source"] = "logs/combined.log"
    _safe(run, "analysis.json", lambda: writer.write_json("analysis.json", result))
    return result


def _file_blocks(path: Path) -> Any:
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                yield chunk
    except OSError:
        return


def _stop_run(run: _Run, reason: str) -> None:
    """The watchdog's stop: SIGINT → SIGTERM → SIGKILL to CMD's group (recorded)."""
    run.stopped_by = reason
    run.stop_record = StopRecord(reason)
    escalate(
        run.stop_record,
        run.kill_group,
        run.child_exited.wait,
        grace=run.opts.grace,
        say=run.say,
    )


def _stages_reached(analysis: Mapping[str, Any] | None, run: _Run) -> list[str]:
    seen: list[str] = []
    for span in (analysis or {}).get("stages") or []:
        st = span.get("stage")
        if st in STAGES and st not in seen:
            seen.append(st)
    if run.readiness is not None and run.readiness.ready and "api_ready" not in seen:
        seen.append("api_ready")
    if any(r.get("status") == 200 for r in run.requests) and "serving" not in seen:
        seen.append("serving")
    return seen


def _summary(
    run: _Run, launch: Mapping[str, Any], analysis: Mapping[str, Any] | None, lines: int
) -> str:
    parts: list[str] = []
    rd = run.readiness
    if rd is not None and rd.ready:
        parts.append(f"API ready in {rd.seconds:.1f} s (model {rd.served_model})")
        fixed = [r for r in run.requests if r["kind"] in ("fixed", "custom")]
        if fixed:
            ok = sum(1 for r in fixed if r.get("status") == 200)
            parts.append(f"fixed request {ok}/{len(fixed)} answered 200")
        if run.prefix:
            c = run.prefix["checks"][0]
            parts.append(f"prefix probe: {c['status']} ({c['evidence']})")
    elif rd is not None:
        parts.append(rd.error or "api_ready not reached")
    ff = (analysis or {}).get("first_failure")
    if ff:
        text = str(ff.get("text", ""))
        text = text if len(text) <= 160 else text[:159] + "…"
        parts.append(
            f"first causal failure at line {ff.get('line_no')} "
            f"({ff.get('stage')}/{ff.get('category')}, rule {ff.get('rule')}): {text}"
        )
        parts += engine_numbers(analysis)
    elif analysis is not None:
        last = analysis.get("last_stage_reached") or "none reached"
        parts.append(f"no failure found (last stage: {last})")
    if launch.get("signal"):
        end = f"killed by signal {launch['signal']}"
    else:
        end = f"exit code {launch.get('exit_code')}"
    if launch.get("interrupted_by"):
        end += f" after {launch['interrupted_by']}"
    elif run.stopped_by:
        end += f" after {run.stopped_by}"
    parts.append(f"{end}; {lines} log lines")
    return "; ".join(parts) + "."


def main_passthrough_sinks() -> tuple[Callable[[bytes], None], Callable[[bytes], None]]:
    """Sinks writing to this process's real stdout/stderr (fd 1 and 2), or their buffers."""
    from kk3evidence.capture.pump import fd_writer

    sinks: list[Callable[[bytes], None]] = []
    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):
            buf = getattr(stream, "buffer", None)

            def write(data: bytes, stream: Any = stream, buf: Any = buf) -> None:
                if buf is not None:
                    buf.write(data)
                    buf.flush()
                else:
                    stream.write(data.decode("utf-8", "replace"))
                    stream.flush()

            sinks.append(write)
        else:
            with contextlib.suppress(AttributeError, OSError, ValueError):
                stream.flush()
            sinks.append(fd_writer(fd))
    return sinks[0], sinks[1]
