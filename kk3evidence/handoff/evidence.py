"""One bundle's evidence, read once into memory for diff, check, report and compare.

The JSON members are turned into typed records once, here (``Launch``, ``Notes``,
``Fingerprint``, ``Request`` in :mod:`kk3evidence.handoff.records`): the comparison modules read
fields, never dotted strings, and can be tested without a tar file. ``load`` reads a
bundle through :func:`kk3evidence.bundle.open_bundle` (which verifies safety and hashes first),
keeps the small JSON members, a window of log lines around the first causal failure and the
per-line receive times, and runs the analyzer when the bundle carries no ``analysis.json``.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

from kk3evidence.analysis.budget import Budget
from kk3evidence.analysis.engine_config import EngineConfig
from kk3evidence.errors import BundleError, InputError
from kk3evidence.handoff.logwindow import LineCursor
from kk3evidence.handoff.records import Fingerprint, Launch, Notes, PrefixProbe, Request
from kk3evidence.model import JSONObject, JSONValue

__all__ = [
    "Evidence", "Fingerprint", "Launch", "LogLine", "Notes", "Request", "coerce", "from_dicts",
    "load", "other_gpu_processes",
]

#: lines of log kept before and after the first causal failure
WINDOW_BEFORE = 12
WINDOW_AFTER = 8


@dataclass(frozen=True, slots=True)
class LogLine:
    line_no: int  # 1-based in logs/combined.log
    text: str


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the hand-off modules need from one bundle, typed once at load."""

    source: str
    manifest: Mapping[str, Any] = field(default_factory=dict)
    fingerprint: Fingerprint = field(default_factory=Fingerprint)
    launch: Launch = field(default_factory=Launch)
    notes: Notes = field(default_factory=Notes)
    analysis: Mapping[str, Any] | None = None
    requests: tuple[Request, ...] = ()
    metrics: Mapping[str, str] = field(default_factory=dict)
    log_window: tuple[LogLine, ...] = ()
    log_tail: tuple[LogLine, ...] = ()
    line_times: Mapping[int, float] = field(default_factory=dict)  # line_no -> wall seconds
    prefix_probe: PrefixProbe | None = None  # probes/prefix_probe.json, when captured

    @property
    def label(self) -> str:
        return Path(self.source).name or self.source

    @property
    def argv(self) -> list[str]:
        return list(self.launch.argv)

    @property
    def engine_config(self) -> EngineConfig | None:
        """What vLLM reported it runs with (SPEC §4), or None when the log has no such lines."""
        return EngineConfig.from_json((self.analysis or {}).get("engine_config"))

    @property
    def first_failure(self) -> Mapping[str, JSONValue] | None:
        if not self.analysis:
            return None
        ff = self.analysis.get("first_failure")
        return ff if isinstance(ff, Mapping) else None

    @property
    def last_stage_reached(self) -> str | None:
        stage: Any = None
        if self.analysis:
            stage = self.analysis.get("last_stage_reached")
        if stage is None and self.launch.stages_reached:
            stage = self.launch.stages_reached[-1]
        return str(stage) if stage is not None else None


def from_dicts(
    source: str,
    *,
    manifest: Mapping[str, object] | None = None,
    fingerprint: Mapping[str, object] | Fingerprint | None = None,
    launch: Mapping[str, object] | Launch | None = None,
    notes: Mapping[str, object] | Notes | None = None,
    analysis: Mapping[str, JSONValue] | None = None,
    requests: Sequence[Mapping[str, object] | Request] = (),
    metrics: Mapping[str, str] | None = None,
    log_lines: Iterable[str] | None = None,
) -> Evidence:
    """Build an :class:`Evidence` from member dicts (tests, other tools, already-open bundles)."""
    window: tuple[LogLine, ...] = ()
    tail: tuple[LogLine, ...] = ()
    if log_lines is not None:
        ff = (analysis or {}).get("first_failure") if analysis else None
        target = (int(cast(int, ff["line_no"])) if isinstance(ff, Mapping) and "line_no" in ff
                  else None)
        window, tail = _windows((s.encode() for s in log_lines), target)
    return Evidence(
        source=source,
        manifest=dict(manifest or {}),
        fingerprint=fingerprint if isinstance(fingerprint, Fingerprint)
        else Fingerprint.from_json(fingerprint),
        launch=launch if isinstance(launch, Launch) else Launch.from_json(launch),
        notes=notes if isinstance(notes, Notes) else Notes.from_json(notes),
        analysis=dict(analysis) if analysis is not None else None,
        requests=tuple(r if isinstance(r, Request) else Request.from_json(r) for r in requests),
        metrics=dict(metrics or {}),
        log_window=window,
        log_tail=tail,
    )


#: bytes of one log line kept for display (a received bundle may hold megabyte lines)
MAX_SHOWN_LINE = 4096


def _decode(raw: bytes) -> str:
    cut = len(raw) - MAX_SHOWN_LINE
    if cut > 2:  # more than the end of line beyond the limit
        raw = raw[:MAX_SHOWN_LINE] + f" [... {cut} more bytes]".encode()
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    # tqdm bars rewrite one line with \r: keep only the last state for display.
    if "\r" in text:
        text = text.rsplit("\r", 1)[-1]
    return text


def _windows(
    lines: Iterable[bytes], target: int | None
) -> tuple[tuple[LogLine, ...], tuple[LogLine, ...]]:
    """One streaming pass: the lines around ``target`` and the last lines of the log."""
    before: collections.deque[LogLine] = collections.deque(maxlen=WINDOW_BEFORE)
    tail: collections.deque[LogLine] = collections.deque(maxlen=WINDOW_BEFORE)
    window: list[LogLine] = []
    for no, raw in enumerate(lines, start=1):
        line = LogLine(no, _decode(raw))
        tail.append(line)
        if target is None:
            continue
        if no < target:
            before.append(line)
        elif no == target:
            window = [*before, line]
        elif no <= target + WINDOW_AFTER:
            window.append(line)
    return tuple(window), tuple(tail)


def _shown(raw: bytes, length: int) -> str:
    """:func:`_decode` for a line known by its head and its full ``length``."""
    cut = length - MAX_SHOWN_LINE
    if cut > 2:
        raw = raw[:MAX_SHOWN_LINE] + f" [... {cut} more bytes]".encode()
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    return text.rsplit("\r", 1)[-1] if "\r" in text else text


def _stream_windows(
    fp: BinaryIO, target: int | None
) -> tuple[tuple[LogLine, ...], tuple[LogLine, ...]]:
    """:func:`_windows` over a member stream at C speed: lines are counted in chunks and only
    the ones shown are kept (issue 16: a multi-GB log took most of a minute line by line)."""
    span = (target - WINDOW_BEFORE, target + WINDOW_AFTER) if target is not None else (0, -1)
    seen, last = LineCursor(fp).tail(WINDOW_BEFORE, MAX_SHOWN_LINE + 64, span)
    window = [LogLine(no, _shown(raw, n)) for no, raw, n in seen]
    if not any(line.line_no == target for line in window):
        window = []  # the target past the end: nothing around it (as the line-by-line pass)
    return tuple(window), tuple(LogLine(no, _shown(raw, n)) for no, raw, n in last)


def _line_times(bundle: Any, wanted: set[int] | None = None) -> dict[int, float]:
    """Map line number -> receive wall time (seconds) from ``logs/lines.tsv``, if present.

    With ``wanted``, only those lines and the first are kept and reading stops after the
    last of them: memory and time follow what a report shows, not the member's size."""
    out: dict[int, float] = {}
    try:
        stream = bundle.open_member("logs/lines.tsv")
    except (KeyError, FileNotFoundError, BundleError, InputError):
        return out
    with stream:
        if wanted is None:
            for no, raw in enumerate(_rows(stream)):
                _time_row(out, no, raw)
            return out
        # Row n+1 of lines.tsv (after its header) is log line n: jump to each wanted row.
        cur = LineCursor(stream)
        for line in sorted({1, *wanted}):
            cur.skip_to(line + 1)
            got = cur.read(256)
            if got is None:
                break
            _time_row(out, line, got[0])
    return out


def _time_row(out: dict[int, float], no: int, raw: bytes) -> None:
    if no == 0:
        return  # header row
    parts = raw.decode("utf-8", errors="replace").rstrip("\n").split("\t")
    if len(parts) >= 3:
        try:
            out[no] = int(parts[2]) / 1e9
        except ValueError:
            pass


def _rows(stream: Any, limit: int = 256) -> Iterator[bytes]:
    """Rows of ``lines.tsv``, each cut at ``limit`` bytes (a real row is under 80): a hostile
    row without a newline never fills memory."""
    while row := stream.readline(limit):
        if len(row) == limit and not row.endswith(b"\n"):
            while (rest := stream.readline(limit)) and not rest.endswith(b"\n"):
                pass
        yield row


_LOG = "logs/combined.log"

#: what report/diff/compare analyse of a log that has no stored analysis (issue 16): the
#: first 256 MiB, where start-up failures are, and the last 64 MiB, where a serving crash
#: and the end of the run are; the middle is only counted. ``--full`` lifts it.
CONSUMER_BUDGET = Budget(256 * 1024 * 1024, 64 * 1024 * 1024, lift="--full")
_full_analysis: contextvars.ContextVar[bool] = contextvars.ContextVar("full", default=False)


def consumer_budget() -> Budget | None:
    """The budget of the analysis a consumer runs, or None under :func:`full_analysis`."""
    return None if _full_analysis.get() else CONSUMER_BUDGET


@contextlib.contextmanager
def full_analysis(full: bool = True) -> Iterator[None]:
    """Within this block, consumers analyse whole logs (the CLI's ``--full``)."""
    token = _full_analysis.set(full)
    try:
        yield
    finally:
        _full_analysis.reset(token)


_coverage_seen: contextvars.ContextVar[list[tuple[str, JSONObject]] | None] = (
    contextvars.ContextVar("coverage_seen", default=None))


@contextlib.contextmanager
def collect_coverage() -> Iterator[list[tuple[str, JSONObject]]]:
    """Within this block, every bundle loaded whose log was analysed only in part adds
    ``(source, coverage)`` to the yielded list (for the CLI to say so)."""
    seen: list[tuple[str, JSONObject]] = []
    token = _coverage_seen.set(seen)
    try:
        yield seen
    finally:
        _coverage_seen.reset(token)


def load(path: str | Path) -> Evidence:
    """Read a bundle (verified) into an :class:`Evidence`; analyse its log when needed."""
    from kk3evidence.bundle.archive import open_bundle

    source = str(path)
    with open_bundle(path) as bundle:
        analysis: dict[str, Any] | None = bundle.analysis
        known_tail: tuple[LogLine, ...] | None = None
        if analysis is None:
            analysis, known_tail = _analyze(bundle, source)
        ff = analysis.get("first_failure") if analysis else None
        target = int(ff["line_no"]) if isinstance(ff, Mapping) and "line_no" in ff else None
        window: tuple[LogLine, ...] = ()
        tail: tuple[LogLine, ...] = known_tail or ()
        if bundle.has(_LOG) and known_tail is None:
            with bundle.open_member(_LOG) as fp:
                window, tail = _stream_windows(fp, target)
        elif bundle.has(_LOG) and target is not None:
            # The analysis pass kept the last lines: read only up to the failure's window
            # (one pass less over a multi-GB .tar.gz; the hashes were checked at open).
            with bundle.open_member(_LOG) as fp:
                window = _head_window(fp, target)
        metrics: dict[str, str] = {}
        labels = bundle.metrics_labels() if hasattr(bundle, "metrics_labels") else [
            "before", "after"]
        for label in labels:
            text = bundle.metrics(label)
            if text is not None:
                metrics[label] = text
        return Evidence(
            source=source,
            manifest=bundle.manifest or {},
            fingerprint=Fingerprint.from_json(bundle.fingerprint),
            launch=Launch.from_json(bundle.launch),
            notes=Notes.from_json(bundle.notes),
            analysis=analysis,
            requests=tuple(Request.from_json(r) for r in bundle.requests()),
            metrics=metrics,
            log_window=window,
            log_tail=tail,
            line_times=_line_times(bundle, _lines_shown(analysis)),
            prefix_probe=_prefix_probe(bundle),
        )


def _lines_shown(analysis: Mapping[str, Any] | None) -> set[int]:
    """The log lines whose receive time a report uses: stage bounds and the first failure."""
    wanted: set[int] = set()
    for stage in (analysis or {}).get("stages") or []:
        if isinstance(stage, Mapping):
            for key in ("first_line", "last_line"):
                value = stage.get(key)
                if isinstance(value, int) and value > 0:
                    wanted.add(value)
    ff = (analysis or {}).get("first_failure")
    if isinstance(ff, Mapping) and isinstance(ff.get("line_no"), int):
        wanted.add(int(ff["line_no"]))
    return wanted


def _prefix_probe(bundle: Any) -> PrefixProbe | None:
    import json

    if not bundle.has("probes/prefix_probe.json"):
        return None
    try:
        return PrefixProbe.from_json(json.loads(bundle.read_bytes("probes/prefix_probe.json")))
    except (ValueError, KeyError, BundleError, InputError):
        return None


def _analyze(
    bundle: Any, source: str
) -> tuple[dict[str, Any] | None, tuple[LogLine, ...] | None]:
    """Analyse the bundle's combined log when no ``analysis.json`` was stored; also the last
    lines of the log, seen on the way (None when they could not be told)."""
    try:
        from kk3evidence.analysis.engine import analyze
    except ImportError:  # analyzer not installed in this build
        return None, None
    if not bundle.has(_LOG):
        return None, None
    with bundle.open_member(_LOG) as fp:
        reads = _SmallReads(fp)
        result = analyze(reads, budget=consumer_budget(), label=source)
    data: dict[str, Any] = result.to_json()
    data["source"] = source
    seen = _coverage_seen.get()
    if seen is not None and result.coverage is not None:
        seen.append((source, result.coverage))
    return data, reads.last_lines(result.lines_total)


class _SmallReads:
    """A member stream read 1 MiB at a time (the analyzer's 16 MiB blocks of huge lines cost
    ~70 MB; a report's memory should follow what it shows), keeping the last two reads."""

    def __init__(self, fp: BinaryIO) -> None:
        self._fp = fp
        self._last: collections.deque[bytes] = collections.deque(maxlen=2)
        self._total = 0

    def read(self, size: int = -1) -> bytes:
        data = self._fp.read(1024 * 1024 if size < 0 else min(size, 1024 * 1024))
        if data:
            self._last.append(data)
            self._total += len(data)
        return data

    def last_lines(self, lines_total: int) -> tuple[LogLine, ...] | None:
        """The log's last lines (numbered from the analysis's line count), or None when the
        kept bytes hold no whole line (then a full pass finds them)."""
        data = b"".join(self._last)
        whole = len(data) == self._total
        if not whole:  # not from the start: drop the cut first line
            data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""
        parts = data.split(b"\n")
        raws = [x + b"\n" for x in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
        if not whole and len(raws) < WINDOW_BEFORE:
            return None  # long last lines: the full pass tells them exactly
        first = lines_total - len(raws) + 1
        shown = [LogLine(first + i, _shown(raw[: MAX_SHOWN_LINE + 64], len(raw)))
                 for i, raw in enumerate(raws)]
        return tuple(shown[-WINDOW_BEFORE:])


def _head_window(fp: BinaryIO, target: int) -> tuple[LogLine, ...]:
    """The lines around ``target``, reading no further than they are."""
    cur = LineCursor(fp)
    cur.skip_to(max(1, target - WINDOW_BEFORE))
    out: list[LogLine] = []
    while cur.next_line <= target + WINDOW_AFTER:
        no = cur.next_line
        got = cur.read(MAX_SHOWN_LINE + 64)
        if got is None:
            break
        out.append(LogLine(no, _shown(*got)))
    return tuple(out) if any(line.line_no == target for line in out) else ()


def coerce(item: Evidence | str | Path) -> Evidence:
    return item if isinstance(item, Evidence) else load(item)


def other_gpu_processes(ev: Evidence) -> list[str] | None:
    """Processes of other jobs on the GPUs, or None when nobody could see them.

    ``notes.cluster.gpu_processes`` (written by capture, which already left out the server's own
    process group) wins; otherwise the fingerprint's per-GPU processes minus the launched pid.
    Without NVML there is no process list at all: that is unknown, not "no other jobs".
    """
    cluster = ev.notes.cluster
    if cluster is not None and cluster.gpu_processes:
        return [p.describe() for p in cluster.gpu_processes]
    if not ev.fingerprint.gpus.nvml:
        return None
    return [p.describe() for d in ev.fingerprint.gpus.devices for p in d.processes
            if p.pid is None or p.pid != ev.launch.pid]
