"""Live progress, the stall watchdog, the ready timeout, and a stop that works.

One thread (:class:`Watchdog`) looks every ``tick`` seconds at:

* the bytes the pump has passed through (a counter it only reads: the pass-through is never
  touched, so a tqdm ``\\r`` update counts as progress like any other output), and
* the new part of ``logs/combined.log`` as the log writer appends it, run through the analysis
  milestone rules (:class:`~kk3evidence.analysis.progress.MilestoneWatcher`) for the stage.

It draws the one-line progress (stage, time in it, last milestone, output rate) and, when there
was neither new output nor a stage change for the stage's budget (``--stall-after``), takes a
stall snapshot (:mod:`.snapshot`), a second one a little later, and with ``--stall-action
stop`` stops the command. ``--ready-timeout`` does the same for a server not ready in time.
Silence after the server is ready is normal (an idle server) and never a stall; requests that
stop moving are: after ready the new log goes through
:class:`~kk3evidence.analysis.serving_stall.ServingStallWatch`, and a stats line showing
requests running at 0 tokens/s, followed by a second one or by SILENT_S seconds without a
stats line of that engine, triggers the same snapshots (``serving-stall``).

:func:`escalate` is the stop: SIGINT, then SIGTERM, then SIGKILL to the command's process
group, each after a grace period, recording which signal ended it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from kk3evidence.analysis.progress import MilestoneWatcher
from kk3evidence.analysis.serving_stall import SILENT_S, ServingStallWatch
from kk3evidence.capture import snapshot as snap
from kk3evidence.errors import UsageError
from kk3evidence.model import STAGES, JSONObject, ServingStall

__all__ = [
    "DEFAULT_STAGE_BUDGETS",
    "DEFAULT_STALL_AFTER",
    "StallPolicy",
    "StopRecord",
    "Watchdog",
    "escalate",
    "parse_stall_after",
    "prepare_watchdog",
    "start_watchdog",
]

#: seconds without output or stage change before a snapshot (hour-long start-ups print
#: something at least every few minutes: weight shards, compile, graph capture)
DEFAULT_STALL_AFTER = 600.0
#: stages that may stay silent longer: a cold torch.compile / CUDA-graph capture of a huge model
DEFAULT_STAGE_BUDGETS: Mapping[str, float] = {"engine_init": 1800.0}
_READ_PER_TICK = 1024 * 1024  # log bytes classified per tick at most (a flood is skipped)
_MAX_STALL_SNAPSHOTS = 3  # pairs of snapshots per run with --stall-action record


def parse_stall_after(values: tuple[str, ...] | list[str]) -> tuple[float | None, dict[str, float]]:
    """``("900", "engine_init=1800")`` -> ``(900.0, {"engine_init": 1800.0})``; ``0`` = off."""
    default: float | None = None
    per: dict[str, float] = {}
    for v in values:
        stage, sep, secs = v.rpartition("=")
        try:
            seconds = float(secs)
        except ValueError:
            seconds = -1.0
        if seconds < 0 or (sep and stage not in STAGES):
            raise UsageError(
                f"--stall-after {v!r}: expected SECONDS or STAGE=SECONDS with a stage from "
                f"{', '.join(STAGES)}, e.g. --stall-after 900 --stall-after engine_init=1800"
            )
        if sep:
            per[stage] = seconds
        else:
            default = seconds
    return default, per


@dataclass(frozen=True, slots=True)
class StallPolicy:
    stall_after: float = DEFAULT_STALL_AFTER  # 0 = no watchdog
    per_stage: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_STAGE_BUDGETS))
    action: str = "record"  # "record" | "stop"
    ready_timeout: float | None = None  # seconds; only for a server with an API
    second_after: float = 10.0  # seconds between the two snapshots
    grace: float = 10.0  # per signal step of the stop
    tick: float = 0.5

    def budget(self, stage: str | None) -> float:
        if stage is not None and stage in self.per_stage:
            return self.per_stage[stage]
        return self.stall_after


@dataclass(slots=True)
class StopRecord:
    """How capture stopped the command (``launch.json`` ``stop``)."""

    reason: str
    sent: list[dict[str, Any]] = field(default_factory=list)
    ended_by: str | None = None
    at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    def to_json(self) -> JSONObject:
        return {
            "reason": self.reason,
            "at": self.at,
            "sent": list(self.sent),
            "ended_by": self.ended_by,
        }


def escalate(
    record: StopRecord,
    kill_group: Callable[[int], bool],
    exited: Callable[[float], bool],
    *,
    grace: float,
    say: Callable[[str], None],
    start: int = signal.SIGINT,
) -> None:
    """SIGINT → SIGTERM → SIGKILL to the group, each after ``grace`` seconds without exit.

    ``exited(timeout)`` waits up to ``timeout`` and says whether the command's group is gone.
    ``record.ended_by`` is the last signal sent before it was (``None``: it ended by itself).
    """
    steps = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
    t0 = time.monotonic()
    for sig in steps[steps.index(signal.Signals(start)) :]:
        if exited(0):
            return
        record.sent.append({"signal": sig.name, "after_s": round(time.monotonic() - t0, 3)})
        record.ended_by = sig.name
        say(f"stopping the command ({record.reason}): {sig.name} to its process group")
        kill_group(sig)
        if exited(grace if sig != signal.SIGKILL else max(grace, 5.0)):
            return
    say("the command's group is still alive after SIGKILL")


class Watchdog:
    """The watchdog thread of one capture (see the module text)."""

    def __init__(
        self,
        policy: StallPolicy,
        *,
        log_path: str,
        bytes_seen: Callable[[], int],
        root_pid: int,
        ready: Callable[[], bool],
        alive: Callable[[], bool],
        save: Callable[[str, JSONObject], None],
        stop: Callable[[str], None],
        say: Callable[[str], None],
        progress: Callable[[str], None] | None = None,
        redact_argv: Callable[[list[str]], list[str]] = list,
        nvml: object = None,
        clock: Callable[[], float] = time.monotonic,
        milestones: MilestoneWatcher | None = None,
    ) -> None:
        self.policy = policy
        self._log_path = log_path
        self._bytes_seen = bytes_seen
        self._root = root_pid
        self._ready = ready
        self._alive = alive
        self._save = save
        self._stop_cb = stop
        self._say = say
        self._progress = progress
        self._redact = redact_argv
        self._nvml = nvml
        self._clock = clock
        self.milestones = milestones if milestones is not None else MilestoneWatcher()
        # After ready: vLLM's stats lines with requests running and no token (serving_stall)
        self.serving = ServingStallWatch()
        self._serving_hit: ServingStall | None = None  # the serving stall acted on
        self._open: tuple[object, float] | None = None  # (open run's key, since when)
        self.snapshots: list[str] = []
        self.stalls = 0
        self.stopped_for: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kk3-watchdog", daemon=True)
        self._fd: int | None = None
        self._offset = 0
        self._started = clock()
        self._last_bytes = 0
        self._last_move = self._started
        self._rate: list[tuple[float, int]] = []

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 30.0) -> None:
        self._done.set()
        if self._thread.ident is not None:
            self._thread.join(timeout)
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    # -- the loop ------------------------------------------------------------------------
    def _run(self) -> None:
        armed = True
        while not self._done.wait(self.policy.tick) and self._alive():
            now = self._clock()
            self._observe(now)
            if self._progress is not None:
                self._progress(self.status_line(now))
            if self.stopped_for is not None:
                continue
            if self._ready_timed_out(now):
                self._stall(now, "ready-timeout")
                continue
            hit = self._serving_stalled(now)
            if hit is not None and self._serving_hit is None and self.policy.budget("serving") > 0:
                self._serving_hit = hit
                self._stall(now, "serving-stall")
                continue
            silent = now - self._last_move
            budget = self.policy.budget(self.milestones.stage)
            if not armed and silent < budget:
                armed = True  # it moved again: a later stall is a new one
            if (
                armed
                and budget > 0
                and silent >= budget
                and not self.milestones.ready
                and not self._ready()
            ):
                armed = False
                if self.policy.action == "stop" or self.stalls < _MAX_STALL_SNAPSHOTS:
                    self._stall(now, "stall")

    def _serving_stalled(self, now: float) -> ServingStall | None:
        """Requests stopped moving after ready: two zero stats lines in a row, or one followed
        by SILENT_S seconds without a stats line of that engine (vLLM logs the later zero lines
        at DEBUG level)."""
        if self.serving.stall is not None:
            return self.serving.stall
        run = self.serving.open_run()
        if run is None:
            self._open = None
            return None
        key = (run.engine, run.last_line)
        if self._open is None or self._open[0] != key:
            self._open = (key, now)
        silent = now - self._open[1]
        return dataclasses.replace(run, silent_s=silent) if silent >= SILENT_S else None

    def _ready_timed_out(self, now: float) -> bool:
        limit = self.policy.ready_timeout
        return (
            limit is not None
            and limit > 0
            and now - self._started >= limit
            and not self._ready()
            and not self.milestones.ready
        )

    def _observe(self, now: float) -> None:
        seen = self._bytes_seen()
        if seen != self._last_bytes:
            self._last_bytes = seen
            self._last_move = now
        self._rate.append((now, seen))
        while len(self._rate) > 2 and now - self._rate[0][0] > 10:
            self._rate.pop(0)
        before = self.milestones.stage
        if self.milestones.ready or self._ready():
            # Serving: the stage no longer changes, and idle silence is no stall; only the
            # engine's stats lines can say that requests stopped moving.
            for data in self._new_log():
                self.serving.feed(data)
            return
        for data in self._new_log():
            self.milestones.feed(data, now)
        if self.milestones.stage != before:
            self._last_move = now

    def _new_log(self) -> list[bytes]:
        if self._fd is None:
            try:
                self._fd = os.open(self._log_path, os.O_RDONLY)
            except OSError:
                return []
        try:
            size = os.fstat(self._fd).st_size
            if size - self._offset > _READ_PER_TICK:
                # A flood: milestones in the skipped part are missed; it is progress anyway.
                self.serving.gap()
                self._offset = size - _READ_PER_TICK
                nl = os.pread(self._fd, 65536, self._offset).find(b"\n")
                self._offset += nl + 1 if nl >= 0 else 0
            data = (
                os.pread(self._fd, size - self._offset, self._offset)
                if size > self._offset
                else b""
            )
        except OSError:
            return []
        self._offset += len(data)
        return [data] if data else []

    # -- a stall -------------------------------------------------------------------------
    def _stall(self, now: float, why: str) -> None:
        self.stalls += 1
        m = self.milestones
        stage = m.stage
        silent = now - self._last_move
        if why == "ready-timeout":
            reason = f"not ready after {now - self._started:.0f} s (--ready-timeout)"
        elif why == "serving-stall" and self._serving_hit is not None:
            st = self._serving_hit
            engine = f"engine {st.engine}" if st.engine is not None else "the engine"
            how = (
                f" on {st.lines} stats lines in a row"
                if st.lines >= 2 or st.silent_s is None
                else f", then no stats line for {st.silent_s:.0f} s"
            )
            reason = (
                f"{engine} stopped moving while serving: {st.running} request(s) running and "
                f"0 tokens/s{how}"
            )
            stage = "serving"
        else:
            reason = (
                f"no output and no stage change for {silent:.0f} s in "
                f"{stage or 'the start-up'} (--stall-after {self.policy.budget(stage):g})"
            )
        self._say(f"stall: {reason}; taking a snapshot of the process tree")
        context = {
            "stage": stage,
            "silent_s": round(silent, 3),
            "elapsed_s": round(now - self._started, 3),
            "last_milestone": m.last.text if m.last else None,
            "log_lines": m.lines + self.serving.lines,
            "trigger": why,
        }
        first = self._snapshot(reason, context)
        if first is not None and not self._done.wait(self.policy.second_after):
            second = self._snapshot(reason + " (second look)", context)
            if second is not None:
                second["unchanged"] = snap.compare(first, second)
                self._write(second)
        if self.policy.action == "stop" or why == "ready-timeout":
            self.stopped_for = why
            self._stop_cb(why)

    def _snapshot(self, reason: str, context: dict[str, Any]) -> dict[str, Any] | None:
        if not self._alive():
            return None
        seq = len(self.snapshots) + 1
        try:
            doc = snap.take_snapshot(
                self._root,
                seq=seq,
                reason=reason,
                context=context,
                redact_argv=self._redact,
                nvml=self._nvml,
            )
        except Exception as exc:  # a probe failure is data, never a crash of the capture
            self._say(f"stall snapshot failed: {type(exc).__name__}: {exc}")
            return None
        for line in snap.dump_text(doc)[:8]:
            self._say(f"  {line}")
        if seq == 1 or doc.get("unchanged") is None:
            self._write(doc)
        return doc

    def _write(self, doc: dict[str, Any]) -> None:
        name = f"stalls/snapshot-{doc['seq']}.json"
        self._save(name, doc)
        if name not in self.snapshots:
            self.snapshots.append(name)

    # -- progress ------------------------------------------------------------------------
    def status_line(self, now: float) -> str:
        m = self.milestones
        stage = m.stage or "starting"
        since = m.stage_since if m.stage_since is not None else self._started
        parts = [f"{stage} {_dur(now - since)}"]
        if m.last is not None:
            parts.append(f"last: {m.last.body[:70].strip()} ({_dur(now - m.last.at)} ago)")
        silent = now - self._last_move
        if silent >= 5:
            parts.append(f"silent {_dur(silent)}")
        else:
            parts.append(self._rate_text())
        return " · ".join(parts)

    def _rate_text(self) -> str:
        if len(self._rate) < 2:
            return "output starting"
        (t0, b0), (t1, b1) = self._rate[0], self._rate[-1]
        rate = (b1 - b0) / max(t1 - t0, 1e-6)
        return f"{rate / 1024:.1f} KiB/s"


def _dur(seconds: float) -> str:
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def prepare_watchdog() -> MilestoneWatcher:
    """Load and compile the milestone rules before CMD starts: done later, the compile would
    hold the GIL while the pump thread passes CMD's first output through."""
    return MilestoneWatcher()


class _Ready(Protocol):
    @property
    def ready(self) -> bool: ...


class _StallOptions(Protocol):
    @property
    def stall(self) -> StallPolicy: ...


class _JsonWriter(Protocol):
    def write_json(self, member: str, obj: object) -> None: ...


class _ArgvRedactor(Protocol):
    def argv(self, argv: Sequence[str]) -> list[str]: ...


class WatchedRun(Protocol):
    """What the watchdog uses of a capture in progress (capture.run's ``_Run``)."""

    @property
    def opts(self) -> _StallOptions: ...
    @property
    def target(self) -> object: ...
    @property
    def readiness(self) -> _Ready | None: ...
    @property
    def pgid(self) -> int | None: ...
    @property
    def child_exited(self) -> threading.Event: ...
    @property
    def problems(self) -> list[str]: ...
    @property
    def stall_docs(self) -> list[JSONObject]: ...
    @property
    def writer(self) -> _JsonWriter: ...
    @property
    def redactor(self) -> _ArgvRedactor: ...
    @property
    def say(self) -> Callable[[str], None]: ...


class WatchedPump(Protocol):
    """What the watchdog reads of capture's output pump: bytes seen per stream."""

    @property
    def bytes_seen(self) -> list[int]: ...


_R = TypeVar("_R", bound=WatchedRun)


def start_watchdog(
    run: _R,
    pump: WatchedPump,
    *,
    milestones: MilestoneWatcher | None = None,
    log_path: str,
    progress: Callable[[str], None] | None,
    nvml: object,
    stop_run: Callable[[_R, str], None],
) -> Watchdog | None:
    """Start the watchdog for one capture; ``None`` when the policy turns it off and there is
    no progress line to draw (or CMD has no process group to watch)."""
    policy: StallPolicy = run.opts.stall
    off = policy.stall_after <= 0 and not policy.per_stage and not policy.ready_timeout
    root = run.pgid
    if (off and progress is None) or root is None:
        return None
    if run.target is None and policy.ready_timeout:
        run.say("--ready-timeout needs an HTTP server to poll; it is ignored for this command")
        policy = dataclasses.replace(policy, ready_timeout=None)

    def ready() -> bool:
        rd = run.readiness
        return rd is not None and bool(rd.ready)

    def save(member: str, doc: JSONObject) -> None:
        try:
            run.writer.write_json(member, doc)
        except Exception as exc:  # recorded, never fatal
            run.problems.append(f"could not write {member}: {type(exc).__name__}: {exc}")
        run.stall_docs[:] = [d for d in run.stall_docs if d.get("seq") != doc.get("seq")]
        run.stall_docs.append({**doc, "member": member})

    dog = Watchdog(
        policy,
        log_path=log_path,
        bytes_seen=lambda: int(sum(pump.bytes_seen)),
        root_pid=root,
        ready=ready,
        alive=lambda: not run.child_exited.is_set(),
        save=save,
        stop=lambda why: stop_run(run, why),
        say=run.say,
        progress=progress,
        redact_argv=lambda argv: list(run.redactor.argv(argv)),
        nvml=nvml,
        milestones=milestones,
    )
    dog.start()
    return dog
