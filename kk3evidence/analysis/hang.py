"""``hang`` as an answer: where a start-up stopped moving, when no line states a failure.

SPEC §2: a run that never became ready and whose log states no failure has not succeeded; the
analysis reports where progress stopped. :class:`HangScan` is fed the same blocks as the engine
and keeps what the verdict needs in bounded memory: the last lines, which ranks of
``world_size=N`` reached which milestone (from the log alone), and the largest gaps between
line timestamps. :func:`apply_hang` then turns a "no failure" analysis of an unfinished start-up
into ``first_failure.basis = "stall"``, category ``hang``, and fills ``Analysis.stall``; with the
bundle's stall snapshots (``stalls/…``) it adds what each process was waiting in.

Pure: no I/O. The bundle members are read by :mod:`.engine` and handed in as parsed JSON.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from kk3evidence.analysis.grammar import LogLine, parse_line
from kk3evidence.analysis.progress import MilestoneWatcher, whole_lines
from kk3evidence.analysis.serving_stall import SILENT_S
from kk3evidence.model import (
    Analysis,
    Finding,
    JSONValue,
    RuleInfo,
    ServingStall,
    StageSpan,
    json_list,
    json_object,
    json_objects,
)

__all__ = [
    "INTERRUPTED_RULE",
    "SERVING_STALL_RULE",
    "STALL_RULE",
    "WAITING_RULE",
    "HangScan",
    "HeldHangScan",
    "StallInputs",
    "apply_hang",
    "describe_stall",
    "receive_times",
    "stage_durations",
    "waiting_in",
]

#: the rule id a stall verdict carries (no rule file line matched: the verdict is the engine's)
STALL_RULE = "STALL001"
#: ... and a serving stall's (requests running, no token: analysis/serving_stall.py)
SERVING_STALL_RULE = "STALL002"
#: ... and a start-up whose log ends in the engine's notices that it waits for its workers
WAITING_RULE = "STALL003"
#: ... and a start-up the operator interrupted (Ctrl-C) before it became ready
INTERRUPTED_RULE = "STALL004"
# vLLM's shared-memory message queue (shm_broadcast.py) logs this once a minute
# (VLLM_RINGBUFFER_WARNING_INTERVAL, 60 s) while the engine waits for its workers to take or
# answer a message. One or a few come during a long warm-up or load (clean corpus logs have up
# to 4); a log that ends in ten or more in a row (ten minutes) has stopped.
_WAIT_NOTICES = ("No available shared memory broadcast block found",)
_WAIT_RUN = 10
_KEEP_LINES = 64
_MAX_GAPS = 3
_STAMP_ALL = 4000  # lines whose timestamps are all read; then one line per _STAMP_STEP bytes
_STAMP_STEP = 2048
_FULL_LINES = 4000
_WORLD_RE = re.compile(rb"world_size=(\d{1,6}) rank=(\d{1,6})")
_TS_RE = re.compile(r"^(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})$")
# Lines that only say the run is being stopped: never "the last progress line".
_STOP_MARKERS = (
    "signal=SIG",
    "received signal",
    "KeyboardInterrupt",
    "Terminated",
    "Shutting down",
    "shutting down",
    "Aborted!",
)

# What a process is waiting in, from its Python (or native) frames, innermost first. The first
# entry whose marker occurs in a frame's function or file names it; order = specificity.
_WAITS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("ncclCommInitRank", "comm_group", ("ncclCommInitRank", "ncclCommInit", "_get_nccl_comm")),
    ("gloo connectFullMesh", "comm_group", ("connectFullMesh", "ProcessGroupGloo", "_new_pg_gloo")),
    ("TCPStore", "comm_group", ("TCPStore", "_create_c10d_store", "store.wait", "_store_based")),
    ("rendezvous", "comm_group", ("rendezvous", "_env_rendezvous_handler", "_tcp_rendezvous")),
    (
        "init_process_group",
        "comm_group",
        ("init_process_group", "new_group", "_new_process_group_helper", "init_distributed"),
    ),
    (
        "compile",
        "engine_init",
        ("torch/_dynamo", "torch/_inductor", "compile_fx", "triton", "cudagraph", "capture_model"),
    ),
    ("weights", "weights_access", ("load_weights", "safetensors", "snapshot_download", "hf_hub")),
    # vLLM's engine core waiting for its workers to answer a step (multiproc executor): the
    # workers are where it stopped. No stage of its own (start-up and serving both do it).
    ("the workers' answer (collective_rpc)", "", ("_wait_for_response", "collective_rpc")),
)


@dataclass(frozen=True, slots=True)
class StallInputs:
    """What a bundle (or a capture in progress) adds to the log: how the run ended, the stall
    snapshots (``stalls/*.json``, parsed), and a reader of per-line receive times."""

    launch: Mapping[str, Any] | None = None
    snapshots: tuple[Mapping[str, Any], ...] = ()
    #: ``lines.tsv`` blocks (a fresh iterator per call), or None
    lines_tsv: Callable[[], Iterable[bytes]] | None = None
    #: the caller knows the run is over where the log ends (``analyze --stopped``): a plain
    #: log then counts as a stopped run, as a bundle's launch record makes it one
    stopped: bool = False


def receive_times(blocks: Iterable[bytes], wanted: Iterable[int]) -> dict[int, float]:
    """``{line_no: receive time (epoch seconds)}`` for the wanted lines, from ``lines.tsv``
    blocks (header, then one ``offset\tstream\twall_ns\tmono_ns`` row per log line)."""
    want = sorted({w for w in wanted if w >= 1})
    out: dict[int, float] = {}
    if not want:
        return out
    row = -1  # the header is row 0 of the file, log line n is row n
    pending = b""
    k = 0
    for data in blocks:
        buf = pending + data
        cut = buf.rfind(b"\n")
        if cut < 0:
            pending = buf
            continue
        block, pending = buf[: cut + 1], buf[cut + 1 :]
        n = block.count(b"\n")
        if k < len(want) and want[k] <= row + n:
            rows = block.split(b"\n")
            while k < len(want) and want[k] <= row + n:
                fields = rows[want[k] - row - 1].split(b"\t")
                if len(fields) >= 3 and fields[2].isdigit():
                    out[want[k]] = int(fields[2]) / 1e9
                k += 1
        row += n
        if k >= len(want):
            break
    return out


def stage_durations(
    analysis: Analysis, times: Mapping[int, float], end: float | None
) -> tuple[StageSpan, ...]:
    """Each stage span with when it started (seconds after the first line) and how long it
    lasted: until the next stage (time order) started, or until ``end`` / the last line."""
    if 1 not in times:
        return analysis.stages
    t0 = times[1]
    last = times.get(analysis.lines_total)
    stop = end if end is not None else last
    starts = sorted(
        (times[s.first_line], s.stage) for s in analysis.stages if s.first_line in times
    )
    out: list[StageSpan] = []
    for s in analysis.stages:
        t = times.get(s.first_line)
        if t is None:
            out.append(s)
            continue
        later = [x for x, _st in starts if x > t]
        until = min(later) if later else stop
        secs = None if until is None else round(max(0.0, until - t), 3)
        out.append(replace(s, started_s=round(t - t0, 3), seconds=secs))
    return tuple(out)


@dataclass(slots=True)
class _Rank:
    first_line: int
    process: str | None
    milestones: dict[str, int]  # stage -> first line attributed to this rank


class HangScan:
    """Fed blocks of the log (whole lines or not); bounded memory."""

    def __init__(self) -> None:
        # Every rank's copy of a milestone counts for the matrix (a start-up has a few hundred).
        self._watch = MilestoneWatcher(full_lines=_FULL_LINES, by_position=True)
        self._pending = b""
        self.lines = 0
        self.tail: collections.deque[tuple[int, str, str | None]] = collections.deque(
            maxlen=_KEEP_LINES
        )
        self.world_size: int | None = None
        self.ranks: dict[int, _Rank] = {}
        self._proc_rank: dict[str, int] = {}
        self._last_ts: tuple[int, datetime] | None = None
        self.gaps: list[tuple[float, int, int]] = []  # (seconds, after_line, at_line)
        self._offset = 0  # bytes of the log scanned before the current block
        self._stamped_cell = -1  # the last _STAMP_STEP cell whose first line was stamped

    @property
    def stage(self) -> str | None:
        """The stage of the latest milestone line (time order)."""
        return self._watch.stage

    @property
    def ready(self) -> bool:
        """A ready line was seen: the scan stopped (no stall verdict can follow)."""
        return self._watch.ready

    def feed(self, data: bytes) -> None:
        if self._watch.ready:
            return  # a long serving log costs nothing more
        block, self._pending = whole_lines(self._pending, data)
        if block:
            self._block(block)

    def finish(self) -> None:
        if self._pending and not self._watch.ready:
            self._block(self._pending + b"\n")
            self._pending = b""

    def skip_lines(self, n: int) -> None:
        """Count ``n`` lines that are not scanned (a budgeted read skips them)."""
        self.lines += n

    def _block(self, block: bytes) -> None:
        base = self.lines
        newlines = block.count(b"\n")  # counted once: the watcher and the tail reuse it
        # World lines first (a rank's milestones in the same block must find it). Newlines are
        # counted from the previous match on, not from the block start (a crash loop has many).
        worlds: list[tuple[LogLine, int, int]] = []
        counted, at = 0, 0
        for wm in _WORLD_RE.finditer(block):
            s = block.rfind(b"\n", 0, wm.start()) + 1
            counted += block.count(b"\n", at, s)
            at = s
            line = parse_line(base + counted + 1, block[s : block.find(b"\n", s)])
            worlds.append((line, int(wm.group(1)), int(wm.group(2))))
        found = self._watch.feed_lines(block, 0.0, newlines=newlines)
        # The scan stops at the ready line itself, wherever the block ends: what follows it
        # in the same block counts no more than a later block would (the answer must not
        # depend on how the log was cut into blocks).
        stop = next((m.line_no for m in found if m.marks == "ready"), None)
        for line, ws, rank in worlds:
            if stop is not None and line.line_no > stop:
                break
            self.world_size = max(self.world_size or 0, ws)
            r = self.ranks.setdefault(rank, _Rank(line.line_no, line.process, {}))
            r.milestones.setdefault("comm_group", line.line_no)
            if line.process:
                self._proc_rank[line.process] = rank
        for m in found:
            if stop is not None and m.line_no > stop:
                break
            who = m.rank if m.rank is not None else self._proc_rank.get(m.process or "")
            if who is not None and who in self.ranks and m.marks != "shutdown":
                self.ranks[who].milestones.setdefault(m.stage, m.line_no)
        self.lines += newlines
        if stop is not None:
            end = 0
            for _ in range(stop - base):
                end = block.find(b"\n", end) + 1
            block, newlines = block[:end], stop - base
        self._tail_and_gaps(block, base, newlines)
        self._offset += len(block)

    def _tail_and_gaps(self, block: bytes, base: int, newlines: int) -> None:
        # Only the block's last lines matter for the tail; timestamps are looked at on lines
        # that carry one at the usual place (cheap: a vLLM prefix "(X pid=N) LEVEL MM-DD ...").
        end = len(block)
        no = base + newlines
        kept: list[tuple[int, str, str | None]] = []
        while end > 0 and len(kept) < _KEEP_LINES:
            s = block.rfind(b"\n", 0, end - 1) + 1
            raw = block[s : end - 1]
            if raw.strip():
                line = parse_line(no, raw)
                kept.append((no, line.text[:2000], line.process))
            no -= 1
            end = s
        for item in reversed(kept):
            self.tail.append(item)
        self._timestamps(block, base)

    def _timestamps(self, block: bytes, base: int) -> None:
        # Every line of the log's first _STAMP_ALL lines is looked at; after them, only the
        # first line that starts in each _STAMP_STEP bytes of the log (a flood is sampled: its
        # gaps are small), so the cost never grows with the number of lines. Both are positions
        # in the whole log, not in the block: the same log gives the same gaps however it was
        # read (a pipe's reads, a budget, the block size).
        n = len(block)
        off = self._offset
        pos, no = 0, base
        while pos < n:
            if no >= _STAMP_ALL:
                cell = (off + pos) // _STAMP_STEP
                if cell == self._stamped_cell:  # this cell has its line: go to the next cell
                    goal = (cell + 1) * _STAMP_STEP - off
                    if goal >= n:
                        break
                    nxt = block.find(b"\n", goal - 1) + 1
                    if nxt <= 0:
                        break
                    no += block.count(b"\n", pos, nxt)
                    pos = nxt
                    continue
                self._stamped_cell = cell
            e = block.find(b"\n", pos)
            if e < 0:
                break
            no += 1
            self._stamp(no, block[pos : min(e, pos + 200)])
            pos = e + 1

    def _stamp(self, no: int, head: bytes) -> None:
        if b":" not in head:
            return
        line = parse_line(no, head)
        m = _TS_RE.match(line.timestamp or "")
        if m is None:
            return
        mo, d, hh, mm, ss = (int(x) for x in m.groups())
        try:
            when = datetime(2000, mo, d, hh, mm, ss)
        except ValueError:
            return
        if self._last_ts is not None:
            gap = (when - self._last_ts[1]).total_seconds()
            if gap > 0:
                self.gaps.append((gap, self._last_ts[0], no))
                self.gaps.sort(reverse=True)
                del self.gaps[_MAX_GAPS:]
        self._last_ts = (no, when)


class HeldHangScan(HangScan):
    """A :class:`HangScan` fed one block late, as :func:`~.engine.analyze` uses it: the block
    held last is scanned by :meth:`finish`, which :func:`apply_hang` calls only when the
    verdict needs the scan. A log read in one block that states a failure (or became ready)
    costs no hang scan at all. The block held is the one the engine was just fed: no memory
    beyond what the caller holds anyway."""

    def __init__(self) -> None:
        super().__init__()
        self._held: bytes | None = None

    def feed(self, data: bytes) -> None:
        held, self._held = self._held, data
        if held is not None:
            super().feed(held)

    def skip_lines(self, n: int) -> None:
        self._scan_held()
        super().skip_lines(n)

    def finish(self) -> None:
        self._scan_held()
        super().finish()

    def _scan_held(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            super().feed(held)


def waiting_in(frames: Sequence[Mapping[str, object]]) -> tuple[str, str, str] | None:
    """``(what, stage, frame)`` for a thread's frames (innermost first), or ``None``."""
    for what, stage, markers in _WAITS:
        for f in frames:
            where = f"{f.get('function') or ''} {f.get('file') or ''}"
            if any(mk in where for mk in markers):
                return what, stage, f"{f.get('function')} ({f.get('file')}:{f.get('line')})"
    return None


def _snapshot_processes(snapshots: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per process of the latest snapshot: what it waits in, with the evidence."""
    if not snapshots:
        return []
    last = snapshots[-1]
    unchanged = set((last.get("unchanged") or {}).get("pids_same_stacks") or [])
    out: list[dict[str, Any]] = []
    for p in last.get("processes") or []:
        found: tuple[str, str, str] | None = None
        thread = None
        for t in p.get("stacks") or []:
            found = waiting_in(t.get("frames") or [])
            if found is not None:
                thread = t.get("name")
                break
        socks = [
            f"{s.get('local')}->{s.get('remote')} {s.get('state')}"
            for s in p.get("sockets") or []
            if s.get("state") in ("LISTEN", "ESTABLISHED", "SYN_SENT")
        ]
        states = [str(t.get("state") or "") for t in p.get("threads") or []]
        out.append(
            {
                "pid": p.get("pid"),
                "name": p.get("name"),
                # every thread in state T/t: SIGSTOP, a job-control stop or a tracer holds it
                "stopped": bool(states) and all(st in ("T", "t") for st in states),
                "waiting_in": found[0] if found else None,
                "stage": (found[1] or None) if found else None,
                "frame": found[2] if found else None,
                "thread": thread,
                "wchan": p.get("wchan"),
                "stacks": p.get("stacks_source"),
                "stacks_same_in_second_snapshot": p.get("pid") in unchanged,
                "sockets": socks[:12],
            }
        )
    return out


def _matrix(scan: HangScan) -> tuple[list[dict[str, Any]], list[int]]:
    ranks = [
        {
            "rank": k,
            "process": r.process,
            "first_line": r.first_line,
            "milestones": dict(sorted(r.milestones.items(), key=lambda kv: kv[1])),
        }
        for k, r in sorted(scan.ranks.items())
    ]
    missing = sorted(set(range(scan.world_size)) - set(scan.ranks)) if scan.world_size else []
    return ranks, missing


def _last_progress(scan: HangScan, shutdown_line: int | None) -> tuple[int, str, str | None]:
    for no, text, proc in reversed(scan.tail):
        if shutdown_line is not None and no >= shutdown_line:
            continue
        if any(mk in text for mk in _STOP_MARKERS):
            continue
        return no, text, proc
    if scan.tail:
        return scan.tail[-1]
    return 1, "", None


def apply_hang(analysis: Analysis, scan: HangScan, inputs: StallInputs | None = None) -> Analysis:
    """The analysis with per-stage durations (when receive times are known) and the stall
    verdict (SPEC §2/§4) where it applies.

    A verdict when: no failure was found, the server never became ready, the command did not
    exit 0, and there is start-up evidence (a stage seen) or a stall snapshot. A first failure
    of category ``hang`` (a timeout rule) gets the same ``stall`` details.
    """
    inputs = inputs or StallInputs()
    # Decided on the analysis alone (durations change no field it reads): only a stall needs
    # the scan, so a held block (HeldHangScan) is scanned only then.
    stalled = _stalled(analysis, inputs)
    waiting = None
    if not stalled and _may_be_waiting(analysis):
        scan.finish()
        waiting = _waiting_run(scan)
        stalled = waiting is not None
    interrupted = None
    if not stalled and _may_be_interrupted(analysis):
        scan.finish()
        interrupted = _interrupt_line(scan)
        stalled = interrupted is not None
    if stalled:
        scan.finish()
    times: dict[int, float] = {}
    serving = analysis.extra.serving_stall
    if inputs.lines_tsv is not None:
        wanted = {1, analysis.lines_total} | {s.first_line for s in analysis.stages}
        if stalled:
            wanted |= {n for n, _t, _p in scan.tail}
        if serving is not None:
            wanted.add(serving.last_line)
        times = receive_times(inputs.lines_tsv(), wanted)
        ended = _ended(inputs.launch)
        analysis = replace(analysis, stages=stage_durations(analysis, times, ended))
    if analysis.first_failure is None and serving is not None:
        serving = _silence_by_times(serving, times, _ended(inputs.launch) or times.get(
            analysis.lines_total))
        if serving.confirmed:
            return _serving_verdict(analysis, serving, inputs.snapshots)
    if not stalled:
        return analysis
    last = _last_progress(scan, _progress_limit(analysis, inputs, times))
    ff = analysis.first_failure
    if scan.ready and ff is not None:
        last = (ff.line_no, ff.text, ff.process)  # a timeout after ready: the scan had stopped
    if waiting is not None:
        last = waiting
    if interrupted is not None:
        last = interrupted
    stall = _stall_record(analysis, scan, inputs, times, last)
    if analysis.first_failure is not None:
        return replace(analysis, stall=stall)
    if waiting is not None:
        return _with_verdict(
            analysis, stall, last, rule=WAITING_RULE, name="engine-waiting-on-workers",
            why=(
                "The run never became ready and the log ends in the engine's own notices that "
                f"it has waited for its workers ({_WAIT_RUN} or more in a row, one a minute): "
                "a worker hangs or never finishes a step."
            ),
        )
    if interrupted is not None:
        return _with_verdict(
            analysis, stall, last, rule=INTERRUPTED_RULE, name="start-up-interrupted",
            why=(
                "The run never became ready, no line states a failure, and it was stopped with "
                "Ctrl-C (KeyboardInterrupt): the operator gave up on a start-up that did not "
                "move. The traceback printed at the stop shows where the main thread waited."
            ),
        )
    return _with_verdict(analysis, stall, last)


def _may_be_interrupted(analysis: Analysis) -> bool:
    """No failure, never ready, no stage seen (with one, :func:`_stalled` decides), and a stop
    was requested: the log may be an interrupted start-up's traceback."""
    return (
        analysis.first_failure is None
        and analysis.extra.ready_line is None
        and analysis.last_stage_reached is None
        and analysis.extra.shutdown_requested_line is not None
    )


_INTERRUPT_RE = re.compile(r"(?:^|[\s\])])KeyboardInterrupt(?::.*)?$")


def _interrupt_line(scan: HangScan) -> tuple[int, str, str | None] | None:
    """The ``KeyboardInterrupt`` exception line of a traceback among the log's last lines (a
    frame line before it): a program that was running when it was stopped. ``None`` when the
    stop left no traceback (a bare ``^C`` or a signal notice is no evidence of a start-up)."""
    frame = False
    for item in scan.tail:
        text = item[1].strip()
        if 'File "' in text:
            frame = True
        elif frame and "raise " not in text and _INTERRUPT_RE.search(text):
            return item
    return None


def _may_be_waiting(analysis: Analysis) -> bool:
    """No failure, never ready, a start-up stage seen: the log may end in waiting notices."""
    return (
        analysis.first_failure is None
        and analysis.extra.ready_line is None
        and analysis.last_stage_reached not in (None, "api_ready", "serving")
    )


def _waiting_run(scan: HangScan) -> tuple[int, str, str | None] | None:
    """The first line of the run of waiting notices the log ends in (blank lines aside), when
    the run holds at least :data:`_WAIT_RUN` of them; else ``None``."""
    first: tuple[int, str, str | None] | None = None
    count = 0
    for item in reversed(scan.tail):
        text = item[1]
        if not text.strip():
            continue
        if not any(n in text for n in _WAIT_NOTICES):
            break
        first, count = item, count + 1
    return first if count >= _WAIT_RUN else None


def _stalled(analysis: Analysis, inputs: StallInputs) -> bool:
    ff = analysis.first_failure
    if ff is not None:
        return ff.category == "hang"
    launch, snapshots = inputs.launch, inputs.snapshots
    ready = analysis.extra.ready_line is not None or analysis.last_stage_reached in (
        "api_ready",
        "serving",
    )
    exited_ok = launch is not None and launch.get("exit_code") == 0
    # From a log alone (a slice, maybe) a start-up without ready line may simply go on: only a
    # stop requested before ready is evidence. A bundle knows how the run ended.
    stopped = (
        launch is not None or inputs.stopped or analysis.extra.shutdown_requested_line is not None
    )
    started = analysis.last_stage_reached is not None or bool(snapshots)
    return not (ready or exited_ok or not started or not (stopped or snapshots))


def _stall_record(
    analysis: Analysis,
    scan: HangScan,
    inputs: StallInputs,
    times: Mapping[int, float],
    last: tuple[int, str, str | None],
) -> dict[str, Any]:
    no, text, proc = last
    ff, launch, snapshots = analysis.first_failure, inputs.launch, inputs.snapshots
    ranks, missing = _matrix(scan)
    procs = _snapshot_processes(snapshots)
    waits = [p for p in procs if p["waiting_in"]]
    stage = scan.stage or analysis.last_stage_reached or "container_init"
    if ff is not None:
        stage = ff.stage
    elif waits and waits[0]["stage"]:
        stage = waits[0]["stage"]
    stall: dict[str, Any] = {
        "stage": stage,
        "since_line": no,
        "last_progress_line": text,
        "process": proc,
        "since": None,
        "world_size": scan.world_size,
        "ranks": ranks,
        "missing_ranks": missing,
        "gaps": [{"after_line": a, "line": b, "seconds": round(g, 3)} for g, a, b in scan.gaps],
        "processes": procs,
        "snapshots": [str(s.get("member")) for s in snapshots if s.get("member")],
        "summary": _summary(stage, text, scan.world_size, missing, waits),
        "next_steps": _next_steps(stage, missing, waits),
    }
    if no in times:
        stall["since"] = datetime.fromtimestamp(times[no], UTC).isoformat()
        end = _ended(launch) or times.get(analysis.lines_total)
        if end is not None:
            stall["silent_s"] = round(max(0.0, end - times[no]), 3)
    if launch is not None:
        stall["stopped_by"] = (launch.get("stop") or {}).get("reason")
    return stall


def _silence_by_times(
    serving: ServingStall, times: Mapping[int, float], end: float | None
) -> ServingStall:
    """A one-line run at the end of the log, confirmed by a bundle's clock: the run went on
    :data:`~.serving_stall.SILENT_S` or more after its last line was received, no stats line
    of its engine since."""
    if serving.confirmed:
        return serving
    t = times.get(serving.last_line)
    if t is None or end is None or end - t < SILENT_S:
        return serving
    return replace(serving, confirmed=True, silent_s=round(end - t, 3))


def _serving_verdict(
    analysis: Analysis, serving: ServingStall, snapshots: Sequence[Mapping[str, Any]] = ()
) -> Analysis:
    """The log states no failure, but the engine's stats lines show requests running and no
    token processed for :data:`~.serving_stall.MIN_LINES` intervals or more in a row."""
    line = parse_line(serving.first_line, serving.text)
    who = f"engine {serving.engine}" if serving.engine is not None else "the engine"
    span = (
        f"lines {serving.first_line}-{serving.last_line}"
        if serving.last_line != serving.first_line
        else f"line {serving.first_line}"
    )
    if serving.lines >= 2 or serving.silent_s is None:
        how = f"on {serving.lines} stats lines in a row ({span})"
    else:
        how = (
            f"at line {serving.first_line}, then no stats line of it for "
            f"{serving.silent_s:.0f} s while the log went on"
        )
    summary = (
        f"{who} stopped making progress while serving: {serving.running} request(s) running "
        f"and 0 tokens/s prompt and generation throughput {how}, with no error logged"
    )
    stall: dict[str, Any] = {
        "stage": "serving",
        "since_line": serving.first_line,
        "last_progress_line": line.text,
        "process": line.process,
        "since": None,
        "until_line": serving.last_line,
        "stats_lines": serving.lines,
        "silent_s": serving.silent_s,
        "requests_running": serving.running,
        "engine": serving.engine,
        "world_size": None,
        "ranks": [],
        "missing_ranks": [],
        "gaps": [],
        "processes": _snapshot_processes(snapshots),
        "snapshots": [str(s.get("member")) for s in snapshots if s.get("member")],
        "summary": summary,
        "next_steps": [
            "Dump the server's stacks while it is stuck (`py-spy dump --pid <engine core pid>`, "
            "or run it under `kk3evidence capture`, which snapshots stalls): a worker waiting "
            "in a collective or on a lock says which step never finished.",
            "Look for the request that started it (the access log just before the first stats "
            "line) and retry it alone; with several GPUs, rerun with NCCL_DEBUG=INFO and "
            "compare the ranks' last lines.",
        ],
    }
    return _with_verdict(
        analysis, stall, (serving.first_line, line.text, line.process),
        rule=SERVING_STALL_RULE,
        name="serving-stopped-moving",
        why="Requests are running but no token was processed in whole stats intervals, and no "
        "line states a failure: the engine stopped stepping (a hung collective, a deadlock, a "
        "request waiting forever).",
    )


def _with_verdict(
    analysis: Analysis,
    stall: dict[str, Any],
    last: tuple[int, str, str | None],
    *,
    rule: str = STALL_RULE,
    name: str = "start-up-stopped-moving",
    why: str = "The run never became ready and no line states a failure: progress stopped.",
) -> Analysis:
    """``first_failure`` = the stall (basis ``stall``, category ``hang``) at the last progress."""
    no, text, proc = last
    stage = str(stall["stage"])
    finding = Finding(
        line_no=no,
        rule=rule,
        stage=stage,
        category="hang",
        kind="failure",
        text=text,
        process=proc,
        severity="fatal",
        basis="stall",
    )
    # The stall line may be a classified warning: the verdict takes its place.
    kept = [f for f in analysis.findings if f.line_no != no]
    findings = tuple(sorted((*kept, finding), key=lambda f: f.line_no))
    extra = replace(analysis.extra, rule=RuleInfo(
        name=name,
        summary=stall["summary"],
        why=why,
        next_steps=tuple(stall["next_steps"]),
        severity="fatal",
    ))
    return replace(
        analysis,
        first_failure=finding,
        findings=findings,
        stages=_with_failed(analysis.stages, stage, no),
        extra=extra,
        stall=stall,
        last_stage_reached=analysis.last_stage_reached or stage,
    )


def _with_failed(spans: tuple[StageSpan, ...], stage: str, line_no: int) -> tuple[StageSpan, ...]:
    """The stage where progress stopped is the failed one (SPEC §4 ``stages``)."""
    if any(s.stage == stage for s in spans):
        return tuple(replace(s, status="failed") if s.stage == stage else s for s in spans)
    return (*spans, StageSpan(stage, "failed", line_no, line_no))


def _progress_limit(
    analysis: Analysis, inputs: StallInputs, times: Mapping[int, float]
) -> int | None:
    """The first line that cannot be the last progress: the requested shutdown, the lines
    after the first stall snapshot, or those received after capture began to stop the run."""
    limits: list[int] = []
    shutdown = analysis.extra.shutdown_requested_line
    if isinstance(shutdown, int):
        limits.append(shutdown)
    for s in inputs.snapshots[:1]:
        n = (s.get("context") or {}).get("log_lines")
        if isinstance(n, int) and n > 0:
            limits.append(n + 1)
    began = _iso((inputs.launch or {}).get("stop", {}) and (inputs.launch or {})["stop"].get("at"))
    if began is not None:
        after = [n for n, t in times.items() if t >= began and n > 1]
        if after:
            limits.append(min(after))
    return min(limits) if limits else None


def _iso(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _ended(launch: Mapping[str, Any] | None) -> float | None:
    return _iso((launch or {}).get("ended_at"))


def _summary(
    stage: str, text: str, world: int | None, missing: list[int], waits: list[dict[str, Any]]
) -> str:
    parts = [f"progress stopped in {stage} after: {text[:200]}"]
    if missing:
        parts.append(
            f"ranks {', '.join(map(str, missing))} of world_size={world} never appeared in "
            "this log (another node that never started or never joined?)"
        )
    if waits:
        w = waits[0]
        parts.append(f"pid {w['pid']} was waiting in {w['waiting_in']} ({w['frame']})")
    return "; ".join(parts)


def _next_steps(stage: str, missing: list[int], waits: list[dict[str, Any]]) -> list[str]:
    steps: list[str] = []
    if missing:
        steps.append(
            "Start (or look at) the node(s) holding the missing ranks: every node must run the "
            "same command with its own --node-rank, and reach --master-addr:--master-port."
        )
    if stage == "comm_group" or any(w["stage"] == "comm_group" for w in waits):
        steps.append(
            "Rerun with NCCL_DEBUG=INFO (TORCH_DISTRIBUTED_DEBUG=DETAIL for Gloo) and check "
            "that the master address/port is reachable from every node (nc -zv ADDR PORT)."
        )
    steps.append("See docs/hangs.md: the rank matrix, the stall snapshot's stacks and sockets.")
    return steps


def describe_stall(stall: Mapping[str, JSONValue]) -> list[str]:
    """Plain lines about a stall (for the analyze text and the report): where and since when,
    the rank × milestone matrix, what each process waited in, the largest gaps."""
    out = [f"Progress stopped in {stall.get('stage')} after line {stall.get('since_line')}"]
    if stall.get("stats_lines"):  # a serving stall (serving_stall.py)
        silent = stall.get("silent_s")
        how = (
            f"then no stats line for {silent:.0f} s"
            if isinstance(silent, int | float) and stall.get("stats_lines") == 1
            else f"on {stall.get('stats_lines')} stats lines in a row "
            f"(to line {stall.get('until_line')})"
        )
        out = [
            f"Progress stopped in serving at line {stall.get('since_line')}: "
            f"{stall.get('requests_running')} request(s) running, 0 tokens/s"
            + (", " if how.startswith("then") else " ")
            + how
        ]
    if stall.get("since"):
        silent = stall.get("silent_s")
        tail = f", silent for {silent:.0f} s" if isinstance(silent, int | float) else ""
        out[0] += f" (received {stall['since']}{tail})"
    if stall.get("stopped_by"):
        out[0] += f"; capture stopped it ({stall['stopped_by']})"
    world = stall.get("world_size")
    if world:
        out.append(f"Ranks (world_size={world}) × milestones, from the log:")
        for r in json_objects(stall.get("ranks")):
            ms = ", ".join(f"{k}@{v}" for k, v in (json_object(r.get("milestones")) or {}).items())
            out.append(f"  rank {r.get('rank')}: {ms or '-'} ({r.get('process') or 'unprefixed'})")
        for m in json_list(stall.get("missing_ranks")):
            out.append(f"  rank {m}: never appeared in this log")
    for p in json_objects(stall.get("processes")):
        what = p.get("waiting_in") or "no known wait in its stacks"
        if p.get("stopped"):
            what = "STOPPED (every thread in state T: SIGSTOP, a job-control stop or a tracer)"
        where = f" in {p.get('frame')}" if p.get("frame") else ""
        same = (
            "; stacks unchanged in the second snapshot"
            if p.get("stacks_same_in_second_snapshot")
            else ""
        )
        sockets = [str(s) for s in json_list(p.get("sockets"))]
        socks = f"; sockets {', '.join(sockets[:3])}" if sockets else ""
        out.append(f"  pid {p.get('pid')} {p.get('name')}: {what}{where}{same}{socks}")
    gaps = json_objects(stall.get("gaps"))
    if gaps:
        out.append(
            "Largest gaps between log timestamps: "
            + ", ".join(f"{g['seconds']:.0f} s before line {g['line']}" for g in gaps)
        )
    return out
