"""Group analysis: the bundles of one multi-node launch read as one run (SPEC §2, §3, §5).

Each node's log is analysed on its own (streamed, as for one bundle), then the nodes are put
on one timeline:

* **Times.** Every log line has a receive time in ``logs/lines.tsv`` (wall and monotonic, taken
  by that node's capture). A line's node time is the wall time of the capture's start pair plus
  the monotonic time elapsed since (so a wall-clock step during the run does not move lines);
  without a start pair the line's own wall time is used.
* **Clock offsets.** Lines that every node prints right after the same collective step (a
  barrier every rank must reach; listed in ``data/group.toml``) happened at nearly the same
  true instant on all nodes. For each node, the k-th such line is paired with the k-th of the
  reference node (the lowest rank); the offset is the median of the differences and the error
  bound is the largest distance of a pair from that median plus the capture's sampling error
  (1 ms), because each pair's true difference lies within the barrier's exit skew. Without a
  shared line the offset is 0 (the wall clocks are trusted; the NTP offsets, where recorded,
  are shown as the bound).
* **First causal failure across nodes.** The candidates are each node's first causal failure
  and each node's death by a signal it was not asked to take (a killed node logs nothing).
  Stated failures and deaths rank by corrected time; a stall (no stated failure) only counts
  when no node stated or died of anything. A failure on another node that comes later (or
  within the clock bound), and every failure line on the other nodes after it, is a
  consequence of the first.
* **Matrix.** node × process (rank) × stage: when each process first logged progress in each
  stage, in seconds since the group's first line.
* **Consistency.** Image, vLLM/PyTorch/NCCL versions, driver, ``NCCL_*``/``GLOO_*``/``VLLM_*``
  environment and argv (without the per-node flags in ``data/group.toml``) must agree; each
  difference is a finding that names the nodes and values.
"""

from __future__ import annotations

import re
import statistics
import tomllib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from kk3evidence._resources import read_text
from kk3evidence.analysis.engine import BLOCK_SIZE, AnalysisEngine
from kk3evidence.analysis.grammar import parse_line
from kk3evidence.analysis.prefilter import Prefilter
from kk3evidence.analysis.rules import RuleSet
from kk3evidence.bundle.archive import Bundle, open_bundle
from kk3evidence.errors import InputError
from kk3evidence.model import Analysis, Finding, JSONObject, JSONValue, json_object, json_str
from kk3evidence.vllm_args import parse_serve_argv

GROUP_SCHEMA = "kk3evidence/group-analysis/v1"
_LOG = "logs/combined.log"
_INDEX = "logs/lines.tsv"
_SAMPLING_ERROR_S = 0.001
_MAX_TEXT = 400
_INDEX_BLOCK = 1 << 20  # lines.tsv is split into rows only in blocks with a wanted row
_PREV_WINDOW = 1 << 16  # how far back the previous line of a process is looked for
#: signals a node is asked to take when a run is stopped on purpose (not a failure)
_STOP_SIGNALS = frozenset({2, 15})
_SIGNAMES = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}


# ------------------------------------------------------------------------------------ data
@dataclass(frozen=True, slots=True)
class Milestone:
    text: str  # literal substring of the line
    name: str
    stage: str
    sync: bool  # printed by every node at the end of the same collective step


@dataclass(frozen=True, slots=True)
class Mark:
    """Where a milestone line is: line number, process, text, and the line number of the
    same process's line before it (None when not in the same read block)."""

    line_no: int
    process: str | None
    text: str
    prev: int | None


@dataclass(frozen=True, slots=True)
class GroupData:
    milestones: tuple[Milestone, ...]
    per_node_flags: frozenset[str]
    per_node_env: frozenset[str]


@lru_cache(maxsize=1)
def group_data() -> GroupData:
    doc = tomllib.loads(read_text("data", "group.toml"))
    return GroupData(
        tuple(
            Milestone(str(m["text"]), str(m["name"]), str(m["stage"]), bool(m.get("sync")))
            for m in doc.get("milestone", [])
        ),
        frozenset(doc.get("per_node_flags", [])),
        frozenset(doc.get("per_node_env", [])),
    )


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """How far a node's clock is ahead of the reference node's (seconds), and how sure."""

    offset_s: float
    bound_s: float | None
    method: str  # "shared-events" | "wall-clock"
    pairs: int

    def to_json(self) -> JSONObject:
        return {
            "offset_s": round(self.offset_s, 6),
            "bound_s": None if self.bound_s is None else round(self.bound_s, 6),
            "method": self.method,
            "pairs": self.pairs,
        }


@dataclass(frozen=True, slots=True)
class Event:
    """One classified line (or a node's death) on the merged timeline."""

    t: float  # corrected wall time, seconds since the epoch
    node: str
    line_no: int | None
    kind: str  # failure | milestone | consequence | death
    stage: str | None
    category: str | None
    rule: str
    text: str
    process: str | None

    def to_json(self, t0: float) -> JSONObject:
        return {
            "t": round(self.t - t0, 6),
            "node": self.node,
            "line_no": self.line_no,
            "kind": self.kind,
            "stage": self.stage,
            "category": self.category,
            "rule": self.rule,
            "text": self.text,
            "process": self.process,
        }


@dataclass(slots=True)
class NodeRun:
    """One node's bundle, analysed, with the receive times of the lines that matter."""

    source: str
    node: str
    rank: int | None
    host: str | None
    group_id: str | None
    analysis: Analysis
    fingerprint: Mapping[str, Any]
    launch: Mapping[str, Any]
    marks: dict[str, list[Mark]]  # milestone name -> its lines, in order
    times: dict[int, float] = field(default_factory=dict)  # line_no -> node time (s)
    last_line_t: float | None = None
    ntp_offset_s: float | None = None
    offset: ClockOffset = ClockOffset(0.0, None, "wall-clock", 0)

    def t(self, line_no: int) -> float | None:
        raw = self.times.get(line_no)
        return None if raw is None else raw - self.offset.offset_s


@dataclass(frozen=True, slots=True)
class GroupAnalysis:
    group_id: str | None
    nodes: tuple[NodeRun, ...]
    first_failure: Event | None
    cause: Finding | None  # the per-node finding behind first_failure (None for a death)
    consequences: tuple[Event, ...]
    timeline: tuple[Event, ...]
    matrix: tuple[dict[str, Any], ...]
    consistency: tuple[dict[str, Any], ...]
    problems: tuple[str, ...]

    @property
    def failed(self) -> bool:
        return self.first_failure is not None


# ---------------------------------------------------------------------------------- loading
def _node_label(group: Mapping[str, Any] | None, index: int) -> tuple[str, int | None]:
    rank = group.get("node_rank") if group else None
    if isinstance(rank, int):
        return f"node{rank}", rank
    return f"node{index}", None


def _scan_log(
    bundle: Bundle, engine: AnalysisEngine, marks: Sequence[Milestone]
) -> dict[str, list[Mark]]:
    """Feed the log to ``engine`` and note where each milestone line is (line number, process,
    text), with one literal scan per block (Hyperscan) and no copy of the block."""
    texts = [(m.name, m.text.encode()) for m in marks]
    found: dict[str, list[Mark]] = {m.name: [] for m in marks}
    lines_before = 0
    carry = b""
    with bundle.open_member(_LOG) as fp:
        while chunk := fp.read(BLOCK_SIZE):
            engine.feed(chunk)
            first = chunk.find(b"\n")
            if first < 0:
                carry += chunk
                continue
            # the line that straddles the previous block ends at `first`
            _find(carry + chunk[: first + 1], lines_before, texts, found)
            last = chunk.rfind(b"\n")
            _find(chunk, lines_before + 1, texts, found, lo=first + 1, hi=last + 1)
            lines_before += 1 + chunk.count(b"\n", first + 1, last + 1)
            carry = chunk[last + 1 :]
    if carry:
        _find(carry + b"\n", lines_before, texts, found)
    for hits in found.values():
        hits.sort(key=lambda k: k.line_no)
    return found


@lru_cache(maxsize=1)
def _milestone_prefilter() -> Prefilter:
    """One literal scan for every milestone text (Hyperscan where available)."""
    marks = group_data().milestones
    return Prefilter([m.text for m in marks], [False] * len(marks))


def _find(
    block: bytes,
    lines_before: int,
    texts: Sequence[tuple[str, bytes]],
    found: dict[str, list[Mark]],
    *,
    lo: int = 0,
    hi: int | None = None,
) -> None:
    """Milestone lines in ``block[lo:hi]`` (whole lines; the first is line lines_before+1)."""
    pf = _milestone_prefilter()
    sync = {m.name for m in group_data().milestones if m.sync}
    hits = sorted((end - len(texts[aid][1]), texts[aid][0]) for end, aid in pf.scan(block, lo, hi))
    # newlines are counted between consecutive hits only: linear in the block
    line_no, at = lines_before + 1, lo
    for pos, name in hits:
        start = block.rfind(b"\n", lo, pos) + 1 or lo
        line_no += block.count(b"\n", at, start)
        at = start
        end = block.find(b"\n", pos)
        line = parse_line(line_no, block[start:end])
        prev = None
        if name in sync and line.pid is not None:
            # the same process's line before: printed before it entered the collective
            back = block.rfind(b"pid=%d)" % line.pid, max(lo, start - _PREV_WINDOW), start)
            if back >= 0:
                prev = line_no - block.count(b"\n", back, start)
        found[name].append(Mark(line_no, line.process, line.text[:_MAX_TEXT], prev))


def _row_time(row: bytes, start: Mapping[str, Any] | None) -> float | None:
    parts = row.split(b"\t")
    if len(parts) < 4:
        return None
    try:
        wall, mono = int(parts[2]), int(parts[3])
    except ValueError:
        return None
    if start is not None:
        return (int(start["wall_ns"]) + mono - int(start["mono_ns"])) / 1e9
    return wall / 1e9


def _read_times(
    bundle: Bundle, wanted: set[int], clock: Mapping[str, Any] | None
) -> tuple[dict[int, float], float | None]:
    """Node times of the wanted lines (and of the last line) from ``logs/lines.tsv``.

    Streams the index in blocks; a block is split into rows only when it holds a wanted row
    (newlines are counted in C otherwise), so a 1 GB log's index costs little more than a read.
    """
    samples = (clock or {}).get("samples") or []
    start = samples[0] if samples and isinstance(samples[0], dict) else None
    times: dict[int, float] = {}
    if not bundle.has(_INDEX):
        return times, None
    todo = sorted(wanted)
    k = 0
    row_no = 0  # data rows before this block (the header is row 0)
    carry = b""
    last_row = b""
    with bundle.open_member(_INDEX) as raw:
        header = raw.readline()
        del header
        while chunk := raw.read(_INDEX_BLOCK):
            data = carry + chunk
            cut = data.rfind(b"\n") + 1
            block, carry = data[:cut], data[cut:]
            n = block.count(b"\n")
            if n:
                last_row = block[block.rfind(b"\n", 0, len(block) - 1) + 1 :]
            while k < len(todo) and todo[k] <= row_no:
                k += 1
            if k < len(todo) and todo[k] <= row_no + n:
                rows = block.split(b"\n")
                while k < len(todo) and todo[k] <= row_no + n:
                    t = _row_time(rows[todo[k] - row_no - 1], start)
                    if t is not None:
                        times[todo[k]] = t
                    k += 1
            row_no += n
    return times, _row_time(last_row.rstrip(b"\n"), start)


def _ntp_offset(clock: Mapping[str, Any] | None) -> float | None:
    ntp = (clock or {}).get("ntp") or {}
    value = ntp.get("offset_s") if isinstance(ntp, dict) else None
    return float(value) if isinstance(value, int | float) else None


def load_node(path: str, index: int, ruleset: RuleSet | None = None) -> NodeRun:
    """Open one node's bundle, analyse its log and read the times of the lines that matter."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such file; give the bundles of one group")
    with open_bundle(p) as bundle:
        if not bundle.has(_LOG):
            raise InputError(f"{path}: bundle has no {_LOG}; nothing to analyse")
        group = bundle.group
        node, rank = _node_label(group, index)
        engine = AnalysisEngine(path, ruleset)
        marks = _scan_log(bundle, engine, group_data().milestones)
        analysis = engine.finish()
        wanted = {f.line_no for f in analysis.findings}
        wanted |= {k.line_no for hits in marks.values() for k in hits}
        wanted |= {k.prev for hits in marks.values() for k in hits if k.prev is not None}
        clock = json_object((group or {}).get("clock"))
        times, last = _read_times(bundle, wanted, clock)
        return NodeRun(
            source=path,
            node=node,
            rank=rank,
            host=_host_of(group, bundle.fingerprint),
            group_id=json_str((group or {}).get("id")),
            analysis=analysis,
            fingerprint=bundle.fingerprint or {},
            launch=bundle.launch or {},
            marks=marks,
            times=times,
            last_line_t=last,
            ntp_offset_s=_ntp_offset(clock),
        )


def _host_of(
    group: Mapping[str, object] | None, fingerprint: Mapping[str, object] | None
) -> str | None:
    """The node's host: as the group recorded it, else the fingerprint's hostname."""
    host = (group or {}).get("host")
    if isinstance(host, str):
        return host
    fp_host = (fingerprint or {}).get("host")
    name = fp_host.get("hostname") if isinstance(fp_host, dict) else None
    return name if isinstance(name, str) else None


# ----------------------------------------------------------------------------------- clocks
def _sync_pairs(node: NodeRun, ref: NodeRun) -> Iterator[tuple[Mark, Mark]]:
    for m in group_data().milestones:
        if m.sync:
            yield from zip(node.marks[m.name], ref.marks[m.name], strict=False)


def estimate_offset(node: NodeRun, ref: NodeRun) -> ClockOffset:
    """``node``'s clock minus ``ref``'s, from the sync lines both printed (see module doc).

    Each pair gives a point estimate (the difference of the two sync lines) and, where both
    nodes' previous lines of the same process are known, an interval the offset must lie in:
    the collective cannot end on one node before the other node entered it, i.e. before that
    node's previous line. The offset is the median estimate clipped into the intersection of
    the intervals; the bound is its distance to the far end of the intersection.
    """
    diffs: list[float] = []
    lo, hi = -float("inf"), float("inf")
    for a, b in _sync_pairs(node, ref):
        ta, tb = node.times.get(a.line_no), ref.times.get(b.line_no)
        if ta is None or tb is None:
            continue
        diffs.append(ta - tb)
        pa = node.times.get(a.prev) if a.prev is not None else None
        pb = ref.times.get(b.prev) if b.prev is not None else None
        if pa is not None and pb is not None:
            lo, hi = max(lo, pa - tb), min(hi, ta - pb)
    if not diffs:
        return ClockOffset(0.0, _ntp_bound(node, ref), "wall-clock", 0)
    mid = statistics.median(diffs)
    if lo <= hi and hi - lo < float("inf"):
        est = min(max(mid, lo), hi)
        bound = max(est - lo, hi - est) + _SAMPLING_ERROR_S
        return ClockOffset(est, bound, "shared-events", len(diffs))
    # no interval (or contradictory ones): the spread of the estimates, honestly labelled
    spread = max(abs(d - mid) for d in diffs)
    return ClockOffset(mid, spread + _SAMPLING_ERROR_S, "shared-events-spread", len(diffs))


def _ntp_bound(node: NodeRun, ref: NodeRun) -> float | None:
    """Without shared lines: each clock is off true time by its NTP offset, so the two differ
    by at most the sum of their magnitudes (None when either is unknown)."""
    if node.ntp_offset_s is None or ref.ntp_offset_s is None:
        return None
    return abs(node.ntp_offset_s) + abs(ref.ntp_offset_s)


# ---------------------------------------------------------------------------------- analysis
def _death(node: NodeRun) -> Event | None:
    """A node whose server died of a signal nobody asked for (a killed node logs nothing)."""
    sig = node.launch.get("signal")
    if not isinstance(sig, int) or sig in _STOP_SIGNALS:
        return None
    if node.launch.get("interrupted_by") or node.launch.get("stopped_by"):
        return None
    t, when = node.last_line_t, "its last line"
    if t is None:  # it printed nothing: the time capture saw it end
        t, when = _epoch(node.launch.get("ended_at")), "when capture saw it end"
    if t is None:
        return None
    name = _SIGNAMES.get(sig, f"signal {sig}")
    return Event(
        t - node.offset.offset_s,
        node.node,
        None,
        "death",
        None,
        "other",
        "GROUP-DEATH",
        f"{node.node}'s server was killed by {name} (no failure in its log; the time is {when})",
        None,
    )


def _epoch(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _event(node: NodeRun, f: Finding, kind: str | None = None) -> Event | None:
    t = node.t(f.line_no)
    if t is None:
        return None
    return Event(
        t, node.node, f.line_no, kind or f.kind, f.stage, f.category, f.rule, f.text, f.process
    )


def _candidates(
    nodes: Sequence[NodeRun],
) -> tuple[list[tuple[Event, Finding | None]], list[tuple[Event, Finding]]]:
    stated: list[tuple[Event, Finding | None]] = []
    stalls: list[tuple[Event, Finding]] = []
    for n in nodes:
        ff = n.analysis.first_failure
        if ff is not None:
            ev = _event(n, ff, "failure")
            if ev is not None:
                if ff.basis == "stall":
                    stalls.append((ev, ff))
                else:
                    stated.append((ev, ff))
        death = _death(n)
        if death is not None:
            stated.append((death, None))
    stated.sort(key=lambda c: c[0].t)
    stalls.sort(key=lambda c: c[0].t)
    return stated, stalls


def _pick_first(nodes: Sequence[NodeRun]) -> tuple[Event | None, Finding | None]:
    stated, stalls = _candidates(nodes)
    if not stated and not stalls:
        return None, None
    pool = stated or stalls
    first, finding = pool[0]
    # a stated failure and a death within the clock bound of each other: the death is the
    # cause (a dying peer is what the other node reports), never the other way round
    bound = max((n.offset.bound_s or 0.0) for n in nodes) + 1.0
    for ev, f in pool[1:]:
        if (
            ev.kind == "death"
            and first.kind != "death"
            and ev.t - first.t <= bound
            and first.category in ("hang", "nccl", "other")
        ):
            return ev, f
    return first, finding


def _consequences(nodes: Sequence[NodeRun], first: Event, cause: Finding | None) -> list[Event]:
    out: list[Event] = []
    for n in nodes:
        for f in n.analysis.findings:
            if f.kind == "milestone":
                continue
            if n.node == first.node and cause is not None and f.line_no == cause.line_no:
                continue
            ev = _event(n, f, "consequence")
            if ev is None:
                continue
            same_node = n.node == first.node
            if (same_node and cause is not None and f.kind == "consequence") or not same_node:
                out.append(ev)
    out.sort(key=lambda e: e.t)
    return out


_PID_RE = re.compile(r"\bpid=(\d+)")
_RANK_RE = re.compile(r"(?:_TP|_DP|_PP|_EP|\brank[ =]?)(\d+)")


def _process_key(process: str | None) -> str:
    """One row per process: vLLM renames a worker ("Worker pid=7" -> "Worker_TP1 pid=7")."""
    if process is None:
        return "-"
    m = _PID_RE.search(process)
    return f"pid={m.group(1)}" if m else process


def _matrix(nodes: Sequence[NodeRun], t0: float) -> list[dict[str, Any]]:
    """node x process (rank) x milestone: when each process first printed each milestone."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for n in nodes:
        for name, hits in n.marks.items():
            for k in hits:
                t = n.t(k.line_no)
                if t is None:
                    continue
                row = rows.setdefault(
                    (n.node, _process_key(k.process)),
                    {
                        "node": n.node,
                        "rank": n.rank,
                        "process": k.process or "-",
                        "process_rank": None,
                        "milestones": {},
                    },
                )
                m = _RANK_RE.search(k.process or "")
                if m and row["process_rank"] is None:  # the name that says the rank wins
                    row["process"], row["process_rank"] = k.process, int(m.group(1))
                row["milestones"].setdefault(name, round(t - t0, 3))
    for row in rows.values():
        row["milestones"] = dict(sorted(row["milestones"].items(), key=lambda kv: kv[1]))
    return sorted(
        rows.values(),
        key=lambda r: (r["node"], r["process_rank"] is None, r["process_rank"] or 0, r["process"]),
    )


def _milestone_events(nodes: Sequence[NodeRun]) -> Iterator[Event]:
    stages = {m.name: m.stage for m in group_data().milestones}
    for n in nodes:
        for name, hits in n.marks.items():
            for k in hits:
                t = n.t(k.line_no)
                if t is not None:
                    yield Event(
                        t,
                        n.node,
                        k.line_no,
                        "milestone",
                        stages[name],
                        None,
                        f"milestone:{name}",
                        k.text,
                        k.process,
                    )


def analyze_group(paths: Sequence[str], *, ruleset: RuleSet | None = None) -> GroupAnalysis:
    """Analyse the bundles of one group as one run (see the module doc for how)."""
    if len(paths) < 2:
        raise InputError("a group analysis needs the bundles of at least two nodes")
    nodes = [load_node(p, i, ruleset) for i, p in enumerate(paths)]
    problems = _check_membership(nodes)
    nodes.sort(key=lambda n: (n.rank is None, n.rank if n.rank is not None else 0, n.source))
    ref = nodes[0]
    for n in nodes[1:]:
        n.offset = estimate_offset(n, ref)
    ref.offset = ClockOffset(0.0, 0.0, "reference", 0)
    first, cause = _pick_first(nodes)
    consequences = _consequences(nodes, first, cause) if first is not None else []
    timeline = sorted(
        (ev for n in nodes for f in n.analysis.findings if (ev := _event(n, f)) is not None),
        key=lambda e: e.t,
    )
    deaths = [d for n in nodes if (d := _death(n)) is not None]
    timeline = sorted([*timeline, *deaths, *_milestone_events(nodes)], key=lambda e: e.t)
    t0 = min((n.times[min(n.times)] - n.offset.offset_s for n in nodes if n.times), default=0.0)
    return GroupAnalysis(
        group_id=next((n.group_id for n in nodes if n.group_id), None),
        nodes=tuple(nodes),
        first_failure=first,
        cause=cause,
        consequences=tuple(consequences),
        timeline=tuple(timeline),
        matrix=tuple(_matrix(nodes, t0)),
        consistency=tuple(consistency(nodes)),
        problems=tuple(problems),
    )


def _check_membership(nodes: Sequence[NodeRun]) -> list[str]:
    problems: list[str] = []
    ids = {n.group_id for n in nodes}
    if len(ids) > 1:
        shown = ", ".join(f"{n.source}: {n.group_id}" for n in nodes)
        problems.append(f"the bundles name different groups ({shown}); read as one run anyway")
    ranks = [n.rank for n in nodes if n.rank is not None]
    if len(ranks) != len(set(ranks)):
        problems.append("two bundles claim the same node rank; labels follow the argument order")
        for i, n in enumerate(nodes):
            n.node, n.rank = f"node{i}", i
    return problems


# ------------------------------------------------------------------------------ consistency
class NodeLike(Protocol):
    """What the consistency check reads of a node (a :class:`NodeRun` or :class:`NodeFacts`)."""

    @property
    def node(self) -> str: ...
    @property
    def fingerprint(self) -> Mapping[str, JSONValue]: ...
    @property
    def launch(self) -> Mapping[str, object]: ...


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """A node's bundle without its log: enough for the consistency check and for pairing."""

    source: str
    node: str
    rank: int | None
    group_id: str | None
    fingerprint: Mapping[str, Any]
    launch: Mapping[str, Any]


def load_facts(paths: Sequence[str]) -> list[NodeFacts]:
    """Open each bundle (verified) and keep its group, fingerprint and launch, rank order."""
    out: list[NodeFacts] = []
    for i, path in enumerate(paths):
        if not Path(path).exists():
            raise InputError(f"{path}: no such file; give the bundles of one group")
        with open_bundle(path) as b:
            node, rank = _node_label(b.group, i)
            out.append(
                NodeFacts(
                    path, node, rank, json_str((b.group or {}).get("id")),
                    b.fingerprint or {}, b.launch or {},
                )
            )
    return out


#: (fingerprint path, what it is called in a sentence)
_FIELDS: tuple[tuple[tuple[str, str], str], ...] = (
    (("container", "image_id"), "image id"),
    (("container", "image_ref"), "image"),
    (("python", "vllm_version"), "vLLM"),
    (("python", "torch_version"), "PyTorch"),
    (("python", "torch_cuda"), "CUDA (torch)"),
    (("python", "nccl_version"), "NCCL"),
    (("gpus", "driver_version"), "driver"),
    (("gpus", "cuda_driver_version"), "CUDA driver"),
)
_ENV_PREFIXES = ("NCCL_", "GLOO_", "VLLM_")
_ABSENT = "(not set)"


def _get(doc: Mapping[str, Any], path: tuple[str, str]) -> str | None:
    part = doc.get(path[0])
    value = part.get(path[1]) if isinstance(part, dict) else None
    return None if value is None else str(value)


def _difference(
    what: str, kind: str, values: Mapping[str, str], say: str, absent: str = "has no {what}"
) -> dict[str, Any] | None:
    """One finding when the nodes disagree; ``say`` formats "<node> runs <say>" per value."""
    distinct = sorted(set(values.values()))
    if len(distinct) < 2:
        return None
    # the reference is the lowest node's value; every other value is named against it
    nodes = sorted(values)
    ref_node = nodes[0]
    parts = [
        f"{n} {_say(say, absent, values[n])}" for n in nodes[1:] if values[n] != values[ref_node]
    ]
    message = ", ".join(parts) + f"; {ref_node} {_say(say, absent, values[ref_node])}"
    return {"what": what, "kind": kind, "values": dict(values), "message": message}


def _say(say: str, absent: str, value: str) -> str:
    return absent if value == _ABSENT else say.format(value=value)


def _version_findings(nodes: Sequence[NodeLike]) -> Iterator[dict[str, Any]]:
    for path, label in _FIELDS:
        values = {n.node: v for n in nodes if (v := _get(n.fingerprint, path)) is not None}
        if len(values) > 1:
            found = _difference(".".join(path), "version", values, f"runs {label} {{value}}")
            if found:
                yield found


def _env_findings(nodes: Sequence[NodeLike], skip: frozenset[str]) -> Iterator[dict[str, Any]]:
    envs = {n.node: json_object(n.fingerprint.get("env")) or {} for n in nodes}
    names = sorted(
        {k for env in envs.values() for k in env if k.startswith(_ENV_PREFIXES) and k not in skip}
    )
    for name in names:
        values = {node: str(env.get(name, _ABSENT)) for node, env in envs.items()}
        if any(v.startswith("<redacted:") for v in values.values()):
            values = {k: ("<redacted>" if v != _ABSENT else v) for k, v in values.items()}
        found = _difference(
            f"env.{name}", "env", values, f"has {name}={{value}}", f"does not set {name}"
        )
        if found:
            yield found


def _flags(launch: Mapping[str, Any], skip: frozenset[str]) -> dict[str, str] | None:
    argv = launch.get("argv")
    if not isinstance(argv, list):
        return None
    try:
        cmd = parse_serve_argv([str(a) for a in argv])
    except InputError:
        return {"argv": " ".join(str(a) for a in argv)}
    flags = {k: str(v) for k, v in cmd.flags.items() if k not in skip}
    flags["(model)"] = str(cmd.model)
    return flags


def _argv_findings(nodes: Sequence[NodeLike], skip: frozenset[str]) -> Iterator[dict[str, Any]]:
    per_node = {n.node: f for n in nodes if (f := _flags(n.launch, skip)) is not None}
    names = sorted({k for f in per_node.values() for k in f})
    for name in names:
        values = {node: f.get(name, _ABSENT) for node, f in per_node.items()}
        shown = name if name.startswith("(") else f"--{name}"
        found = _difference(
            f"argv.{name}", "argv", values, f"runs {shown} {{value}}", f"runs without {shown}"
        )
        if found:
            yield found


def _library_findings(nodes: Sequence[NodeLike]) -> Iterator[dict[str, Any]]:
    """Versions of the libraries the server processes loaded (libnccl, libcudart, …): what
    really ran, also where the Python probe could not say."""
    per_node: dict[str, dict[str, str]] = {}
    for n in nodes:
        libs: dict[str, set[str]] = {}
        raw = n.fingerprint.get("libraries")
        for lib in raw if isinstance(raw, list) else []:
            if isinstance(lib, dict) and lib.get("name") and lib.get("version"):
                libs.setdefault(str(lib["name"]), set()).add(str(lib["version"]))
        per_node[n.node] = {k: "/".join(sorted(v)) for k, v in libs.items()}
    names = sorted({k for libs in per_node.values() for k in libs})
    for name in names:
        values = {node: libs[name] for node, libs in per_node.items() if name in libs}
        if len(values) > 1:
            found = _difference(f"libraries.{name}", "library", values, f"loads {name} {{value}}")
            if found:
                yield found


def consistency(nodes: Sequence[NodeLike]) -> list[JSONObject]:
    """Every difference between the nodes that should not differ in one launch."""
    data = group_data()
    return [
        *_version_findings(nodes),
        *_library_findings(nodes),
        *_env_findings(nodes, data.per_node_env),
        *_argv_findings(nodes, data.per_node_flags),
    ]


# ------------------------------------------------------------------------------------- JSON
def _t0(g: GroupAnalysis) -> float:
    return g.timeline[0].t if g.timeline else 0.0


def to_json(g: GroupAnalysis, sources: Iterable[str] = ()) -> JSONObject:
    """The SPEC §4 object for the group (``first_failure.node`` set; ``line_no`` is in that
    node's log), plus a top-level ``group`` with the nodes, clocks, timeline, matrix and the
    consistency findings (additive: consumers ignore what they do not know)."""
    t0 = _t0(g)
    ff = g.first_failure
    cause_node = next((n for n in g.nodes if ff is not None and n.node == ff.node), None)
    base = cause_node.analysis if cause_node is not None else g.nodes[0].analysis
    out = base.to_json()
    out["source"] = " ".join(sources) or " ".join(n.source for n in g.nodes)
    out["lines_total"] = sum(n.analysis.lines_total for n in g.nodes)
    if ff is None:
        out["first_failure"] = None
    elif ff.kind == "death":
        out["first_failure"] = {
            "stage": _death_stage(cause_node),
            "category": "other",
            "rule": ff.rule,
            "line_no": max(cause_node.analysis.lines_total, 1) if cause_node else 1,
            "text": ff.text,
            "process": None,
            "basis": "fallback",
            "node": ff.node,
        }
    else:
        out["first_failure"] = dict(json_object(out["first_failure"]) or {}, node=ff.node)
    out["consequences"] = [
        {"line_no": e.line_no or 1, "rule": e.rule, "text": e.text, "node": e.node}
        for e in g.consequences
    ]
    out["group"] = _group_json(g, t0)
    return out


def _death_stage(node: NodeRun | None) -> str:
    """A node that died: the stage it was in (its last stage seen, else container_init)."""
    if node is None or not node.analysis.stages:
        return "container_init"
    return max(node.analysis.stages, key=lambda s: s.last_line).stage


def _group_json(g: GroupAnalysis, t0: float) -> dict[str, Any]:
    return {
        "schema": GROUP_SCHEMA,
        "id": g.group_id,
        "t0": t0,
        "clock_method": (
            "per node: median difference of the k-th sync line (data/group.toml) against the "
            "reference node; bound = largest deviation from the median + 1 ms"
        ),
        "nodes": [
            {
                "node": n.node,
                "rank": n.rank,
                "host": n.host,
                "source": n.source,
                "lines_total": n.analysis.lines_total,
                "last_stage_reached": n.analysis.last_stage_reached,
                "first_failure_line": n.analysis.first_failure.line_no
                if n.analysis.first_failure
                else None,
                "exit_code": n.launch.get("exit_code"),
                "signal": n.launch.get("signal"),
                "clock": n.offset.to_json(),
            }
            for n in g.nodes
        ],
        "first_failure_time": None if g.first_failure is None else round(g.first_failure.t - t0, 6),
        "timeline": [e.to_json(t0) for e in g.timeline],
        "matrix": list(g.matrix),
        "consistency": list(g.consistency),
        "problems": list(g.problems),
    }


# ------------------------------------------------------------------------------------- text
def _clip(text: str, width: int = 160) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _node_lines(g: GroupAnalysis) -> list[str]:
    out = [f"Group {g.group_id or '(unnamed)'}: {len(g.nodes)} nodes"]
    for n in g.nodes:
        c = n.offset
        clock = (
            "reference clock"
            if c.method == "reference"
            else f"clock {c.offset_s * 1000:+.1f} ms"
            + (f" ± {c.bound_s * 1000:.1f} ms" if c.bound_s is not None else " (bound unknown)")
            + f" ({c.method}, {c.pairs} pairs)"
        )
        end = n.launch.get("signal")
        end_text = f"signal {end}" if end else f"exit {n.launch.get('exit_code')}"
        out.append(
            f"  {n.node:<6} host {n.host or '?'}, {n.analysis.lines_total} lines, last stage "
            f"{n.analysis.last_stage_reached or 'none'}, {end_text}, {clock}  [{n.source}]"
        )
    return out


def _matrix_lines(g: GroupAnalysis) -> list[str]:
    names = [m.name for m in group_data().milestones]
    used = [n for n in names if any(n in r["milestones"] for r in g.matrix)]
    if not used:
        return []
    out = ["", "Milestones (s) by node and process:"]
    out.append(f"  {'node':<6} {'process':<26} " + " ".join(f"{n:>14}" for n in used))
    for r in g.matrix:
        cells = [r["milestones"].get(n) for n in used]
        shown = " ".join(f"{'-' if c is None else f'{c:.3f}':>14}" for c in cells)
        out.append(f"  {r['node']:<6} {_clip(str(r['process']), 26):<26} {shown}")
    return out


def render_text(g: GroupAnalysis, *, timeline_limit: int = 40) -> str:
    """The human form of a group analysis (the CLI prints it)."""
    out = _node_lines(g)
    out += [f"Problem: {p}" for p in g.problems]
    t0 = _t0(g)
    out += ["", "Merged timeline (seconds since the group's first line; clocks corrected):"]
    shown = [e for e in g.timeline if e.kind != "milestone" or e.rule.startswith("milestone:")]
    for e in shown[:timeline_limit]:
        where = f"{e.node}" + (f":{e.line_no}" if e.line_no else "")
        out.append(f"  {e.t - t0:9.3f}  {where:<12} {e.kind:<11} {_clip(e.text, 120)}")
    if len(shown) > timeline_limit:
        out.append(f"  ... {len(shown) - timeline_limit} more (see --json)")
    out += _matrix_lines(g)
    ff = g.first_failure
    out.append("")
    if ff is None:
        out.append("No failure found on any node.")
    else:
        where = f"line {ff.line_no}" if ff.line_no else "end of its log"
        out.append(
            f"First causal failure: {ff.node}, {where}, stage {ff.stage or '?'}, "
            f"category {ff.category}, rule {ff.rule}"
        )
        out.append(f"  {_clip(ff.text, 200)}")
        if g.consequences:
            out.append(f"Consequences on the nodes ({len(g.consequences)}):")
            for c in g.consequences[:12]:
                out.append(f"  {c.node}:{c.line_no or '-':<6} {c.rule:<9} {_clip(c.text, 140)}")
    out += ["", "Consistency across nodes:"]
    if g.consistency and ff is not None:
        out.append(
            "  Note: the nodes differ where one launch should not; check these first, they can "
            "cause the failure above."
        )
    if not g.consistency:
        out.append("  same versions, NCCL_*/GLOO_*/VLLM_* environment and argv on every node")
    out += [f"  DIFFERENT {d['what']}: {d['message']}" for d in g.consistency]
    return "\n".join(out) + "\n"


def render_markdown(g: GroupAnalysis) -> str:
    """The hand-off form: the text form's facts as markdown tables."""
    t0 = _t0(g)
    out = [f"# Group analysis of `{g.group_id or 'unnamed group'}`", ""]
    out += [
        "| node | host | lines | last stage | clock offset | bound |",
        "|---|---|---|---|---|---|",
    ]
    for n in g.nodes:
        b = n.offset.bound_s
        out.append(
            f"| {n.node} | {n.host} | {n.analysis.lines_total} | "
            f"{n.analysis.last_stage_reached or 'none'} | {n.offset.offset_s * 1000:+.1f} ms | "
            f"{'?' if b is None else f'{b * 1000:.1f} ms'} |"
        )
    ff = g.first_failure
    out += ["", "## First causal failure", ""]
    if ff is None:
        out.append("No failure found on any node.")
    else:
        out.append(
            f"- node **{ff.node}**, line {ff.line_no or '(end of log)'}, "
            f"category **{ff.category}**, rule `{ff.rule}`"
        )
        out += ["", "```text", ff.text, "```"]
        if g.consequences:
            out += [
                "",
                "Consequences: "
                + ", ".join(f"{c.node}:{c.line_no} `{c.rule}`" for c in g.consequences[:20]),
            ]
    out += ["", "## Consistency", ""]
    out += [f"- **{d['what']}**: {d['message']}" for d in g.consistency] or ["- no differences"]
    out += ["", "## Timeline", "", "| t (s) | node | line | kind | text |", "|---|---|---|---|---|"]
    for e in g.timeline[:60]:
        text = _clip(e.text, 100).replace("|", "\\|")
        out.append(f"| {e.t - t0:.3f} | {e.node} | {e.line_no or ''} | {e.kind} | `{text}` |")
    return "\n".join(out) + "\n"
