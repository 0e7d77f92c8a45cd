"""``analyze(source) -> Analysis``: stream a log (or a bundle's log) through the rules.

The fast path never iterates lines in Python: the log is read in large binary blocks cut at
the last newline, one multi-literal scan (:mod:`.prefilter`) finds the anchor hits,
newlines are counted with ``bytes.count`` to number lines, and only candidate lines are decoded,
envelope-parsed and matched. While a Python traceback is open the engine looks at every line
(frames carry no anchors but the exception line that ends them matters). Memory is bounded by
the block size plus capped finding lists, whatever the log size.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import sys
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from kk3evidence.analysis.causality import HintEvent, StageEvidence, resolve
from kk3evidence.analysis.classify import Classified, Classifier
from kk3evidence.analysis.grammar import TB_HEADER, TracebackTracker, decode_line, parse_line
from kk3evidence.analysis.hang import HangScan, StallInputs, apply_hang
from kk3evidence.analysis.prefilter import Prefilter
from kk3evidence.analysis.rules import RuleSet, StageHints, load_rules, load_stage_hints
from kk3evidence.analysis.stall_inputs import bundle_stall_inputs
from kk3evidence.errors import BundleError, InputError
from kk3evidence.model import Analysis

__all__ = ["AnalysisEngine", "analyze"]

BLOCK_SIZE = 16 * 1024 * 1024
MAX_LINE = 1024 * 1024  # longer lines are cut (the head is analysed, the rest skipped)
MAX_HITS = 5000  # classified failure/consequence lines kept (memory stays flat)
MAX_HINTS = 20000  # stage-hint lines kept (rules/stage-hints.toml)
MAX_CONTEXTS = 200  # failure lines whose surrounding lines are kept for the report
MAX_KEPT_TEXT = 8192  # characters of a finding's line kept (longer lines are data dumps)

# Not rule anchors: they start traceback tracking (frames of an excerpt may lack the header).
_STRUCTURAL_ANCHORS = (TB_HEADER, 'File "')
_BUNDLE_SUFFIXES = (".tar", ".tar.gz", ".tgz")
_LOG_MEMBER = "logs/combined.log"


@dataclass(slots=True)
class _Compiled:
    ruleset: RuleSet
    classifier: Classifier
    prefilter: Prefilter
    n_rule_anchors: int
    single: tuple[bool, ...]
    noise_only: tuple[bool, ...]  # anchors of noise rules only: never a reason to look at a line
    completable: frozenset[str]  # stages with completion milestones
    hints: StageHints
    hint_ids: frozenset[int]  # anchors that are `line` stage hints


_CACHE: dict[int, _Compiled] = {}


def _compiled(ruleset: RuleSet, engine: str | None = None) -> _Compiled:
    key = id(ruleset) ^ hash(engine)
    got = _CACHE.get(key)
    if got is not None and got.ruleset is ruleset:
        return got
    anchors = list(ruleset.anchors)
    single = [all(r.simple for r in rules) for rules in ruleset.anchor_rules]
    noise_only = [all(r.kind == "noise" for r in rules) for rules in ruleset.anchor_rules]
    hints = load_stage_hints()
    structural = list(_STRUCTURAL_ANCHORS)
    structural += [n for n, _ in hints.line if n not in structural]
    for a in structural:
        anchors.append(a)
        single.append(False)
        noise_only.append(False)
    c = _Compiled(
        ruleset=ruleset,
        classifier=Classifier(ruleset),
        prefilter=Prefilter(anchors, single, engine=engine),
        n_rule_anchors=len(ruleset.anchors),
        single=tuple(single),
        noise_only=tuple(noise_only),
        completable=frozenset(
            r.stage
            for r in ruleset.rules
            if r.kind == "milestone" and r.stage and r.marks in ("complete", "ready")
        ),
        hints=hints,
        hint_ids=frozenset(i for i, a in enumerate(anchors) if a in {n for n, _ in hints.line}),
    )
    _CACHE[key] = c
    return c


class AnalysisEngine:
    """Incremental analyzer: :meth:`feed` bytes in any chunking, then :meth:`finish`."""

    def __init__(
        self,
        source: str = "-",
        ruleset: RuleSet | None = None,
        *,
        engine: str | None = None,
        context: int = 3,
    ) -> None:
        self.source = source
        self.context = max(0, min(context, 200))
        self._context: dict[int, dict[str, list[list[Any]]]] = {}
        self._tail: list[list[Any]] = []  # last `context` lines of the previous blocks
        self._pending_after: list[tuple[int, list[list[Any]]]] = []  # (hit line, after list)
        self._c = _compiled(ruleset if ruleset is not None else load_rules(), engine)
        self._tracker = TracebackTracker()
        self._pending = bytearray()
        self._skipping_long = False
        self.lines = 0  # complete lines consumed
        self._hits: list[Classified] = []
        self._hint_events: list[HintEvent] = []
        self._hits_dropped = 0
        self._evidence: dict[str, StageEvidence] = {}
        self._shutdown_line: int | None = None
        self._ready_line: int | None = None
        self._long_lines = 0
        self._lo = 0  # bounds of the block being processed
        self._hi = 0

    @property
    def prefilter_engine(self) -> str:
        return self._c.prefilter.engine

    # -- input ---------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        if not data:
            return
        if self._skipping_long:
            nl = data.find(b"\n")
            if nl < 0:
                return
            self._skipping_long = False
            data = data[nl + 1 :]
            if not data:
                return
        cut = data.rfind(b"\n")
        if cut < 0:
            self._pending += data
            if len(self._pending) > MAX_LINE:
                self._flush_long()
            return
        start = 0
        if self._pending:
            first_nl = data.find(b"\n")
            head = bytes(self._pending) + data[: first_nl + 1]
            self._pending.clear()
            if len(head) > MAX_LINE + 1:
                head = head[:MAX_LINE] + b"\n"
                self._long_lines += 1
            self._block(head)
            start = first_nl + 1
        if cut + 1 > start:
            # No copy: the block is scanned in place between start and cut + 1.
            self._block(data, start, cut + 1)
        rest = data[cut + 1 :]
        if rest:
            self._pending += rest
            if len(self._pending) > MAX_LINE:
                self._flush_long()

    def _flush_long(self) -> None:
        """A line longer than MAX_LINE: analyse its head, skip the rest up to its newline."""
        head = bytes(self._pending[:MAX_LINE]) + b"\n"
        self._pending.clear()
        self._long_lines += 1
        self._skipping_long = True
        self._block(head)

    def finish(self) -> Analysis:
        if self._pending:
            tail = bytes(self._pending)
            self._pending.clear()
            self._block(tail, 0, len(tail), final=True)
        res = resolve(
            self._hits,
            self._evidence,
            shutdown_line=self._shutdown_line,
            ready_line=self._ready_line,
            completable=self._c.completable,
            chain_links=self._tracker.chain_links,
            hints=self._hint_events,
            policy=self._c.hints,
        )
        extra: dict[str, Any] = {}
        if res.first_captures:
            extra["first_failure_captures"] = res.first_captures
        if res.first_failure is not None:
            rule = self._c.ruleset.get(res.first_failure.rule)
            if rule is not None:
                extra["first_failure_rule"] = {
                    "name": rule.name,
                    "summary": rule.summary,
                    "why": rule.why,
                    "next_steps": list(rule.next_steps),
                    "severity": rule.severity,
                }
        if res.first_failure is not None and res.first_failure.line_no in self._context:
            extra["first_failure_context"] = self._context[res.first_failure.line_no]
        if res.notes:
            extra["notes"] = list(res.notes)
        if self._hits_dropped:
            extra["findings_truncated"] = self._hits_dropped
        if self._long_lines:
            extra["long_lines_truncated"] = self._long_lines
        if self._shutdown_line is not None:
            extra["shutdown_requested_line"] = self._shutdown_line
        if self._ready_line is not None:
            extra["ready_line"] = self._ready_line
        return Analysis(
            source=self.source,
            lines_total=self.lines,
            last_stage_reached=res.last_stage_reached,
            stages=res.stages,
            first_failure=res.first_failure,
            consequences=res.consequences,
            findings=res.findings,
            extra=extra,
        )

    # -- the block scan ------------------------------------------------------------------

    def _block(self, block: bytes, lo: int = 0, hi: int | None = None, final: bool = False) -> None:
        """Process the whole lines of ``block[lo:hi]`` (it ends with ``\\n`` unless ``final``).
        Offsets stay relative to ``block``: nothing is copied."""
        c = self._c
        base = self.lines
        n = len(block) if hi is None else hi
        self._lo, self._hi = lo, n
        hits = c.prefilter.scan(block, lo, n)
        single = c.single
        # Anchor-only milestones: only their first and last line per block matter.
        firsts: dict[int, int] = {}
        others: list[tuple[int, int]] = []
        for end, aid in hits:
            if single[aid]:
                if aid not in firsts:
                    firsts[aid] = end
            else:
                others.append((end, aid))

        noise_only = c.noise_only
        tracker = self._tracker
        pos = lo
        line_no = base
        k = 0
        n_hits = len(others)
        count = block.count
        find = block.find
        while pos < n:
            if tracker.busy:
                e = find(b"\n", pos, n)
                if e < 0:
                    e = n
                ids: list[int] = []
                while k < n_hits and others[k][0] <= e:
                    if others[k][0] > pos:
                        ids.append(others[k][1])
                    k += 1
                line_no += 1
                self._line(block, pos, e, line_no, ids)
                pos = e + 1
                continue
            # Noise anchors alone never make a line worth a look (noise only suppresses).
            while k < n_hits and (others[k][0] <= pos or noise_only[others[k][1]]):
                k += 1
            if k >= n_hits:
                line_no += count(b"\n", pos, n)
                break
            end, aid = others[k]
            alen = len(c.prefilter.anchor_bytes[aid])
            s = block.rfind(b"\n", pos, max(pos, end - alen)) + 1
            if s <= 0:
                s = pos
            line_no += count(b"\n", pos, s)
            e = find(b"\n", end, n)
            if e < 0:
                e = n
            ids = []
            j = k - 1
            while j >= 0 and others[j][0] > s and others[j][0] > pos:
                ids.append(others[j][1])  # noise anchors earlier in the same line
                j -= 1
            while k < n_hits and others[k][0] <= e:
                ids.append(others[k][1])
                k += 1
            line_no += 1
            self._line(block, s, e, line_no, ids)
            pos = e + 1
        # Every newline of the block was counted on the way (a last line without a newline,
        # when processed, was counted too: take it back).
        nl_total = line_no - base - (1 if pos > n else 0)
        ends_nl = n > lo and block[n - 1] == 10
        if firsts:
            self._simple_milestones(block, lo, n, base=base, firsts=firsts, nl_total=nl_total)
        if self.context:
            self._context_bookkeeping(block, lo, n, base=base, nl_total=nl_total, ends_nl=ends_nl)
        if final and n > lo and not ends_nl:
            # The last line has no newline: it still counts as a line.
            line_no = base + nl_total + 1
        self.lines = line_no
        tracker.tick(line_no)

    def _context_bookkeeping(
        self, block: bytes, lo: int, n: int, *, base: int, nl_total: int, ends_nl: bool
    ) -> None:
        """Complete after-context of failures from earlier blocks; remember this block's tail."""
        want = self.context
        if self._pending_after:
            still: list[tuple[int, list[list[Any]]]] = []
            for hit_no, after in self._pending_after:
                covered = after[-1][0] if after else hit_no
                pos = lo
                no = base + 1
                while len(after) < want and pos < n:
                    if no > covered:
                        f = block.find(b"\n", pos, n)
                        f = n if f < 0 else f
                        after.append([no, decode_line(block[pos:f])])
                        pos = f + 1
                    else:
                        f = block.find(b"\n", pos, n)
                        pos = n if f < 0 else f + 1
                    no += 1
                if len(after) < want:
                    still.append((hit_no, after))
            self._pending_after = still
        tail: list[list[Any]] = []
        end = n - 1 if ends_nl else n
        no = base + nl_total + (0 if ends_nl else 1)
        while len(tail) < want and end >= lo:
            b = block.rfind(b"\n", lo, end) + 1
            if b <= 0:
                b = lo
            tail.append([no, decode_line(block[b:end])])
            no -= 1
            end = b - 1
        tail.reverse()
        if len(tail) < want:
            tail = self._tail[-(want - len(tail)) :] + tail
        self._tail = tail

    def _simple_milestones(
        self, block: bytes, lo: int, n: int, *, base: int, firsts: dict[int, int], nl_total: int
    ) -> None:
        c = self._c
        lasts = c.prefilter.last_offsets(block, list(firsts), lo, n)
        wanted: list[tuple[int, int, int]] = []  # (aid, first_off, last_off)
        offsets: set[int] = set()
        for aid, end in firsts.items():
            first_off = end - 1
            last_off = max(lasts.get(aid, -1), first_off)
            offsets.add(first_off)
            offsets.add(last_off)
            wanted.append((aid, first_off, last_off))
        # Line numbers: count newlines from whichever end of the block is nearer.
        line_at: dict[int, int] = {}
        ordered = sorted(offsets)
        mid = (lo + n) // 2
        front = [o for o in ordered if o < mid]
        back = [o for o in ordered if o >= mid]
        prev = lo
        seen = 0
        for off in front:
            seen += block.count(b"\n", prev, off)
            prev = off
            line_at[off] = base + seen + 1
        prev = n
        after = 0
        for off in reversed(back):
            after += block.count(b"\n", off, prev)
            prev = off
            line_at[off] = base + nl_total - after + 1
        for aid, f_off, l_off in wanted:
            for rule in c.ruleset.anchor_rules[aid]:
                if rule.stage:
                    self._stage_seen(rule.stage, line_at[f_off])
                    self._stage_seen(rule.stage, line_at[l_off])
                    if rule.marks in ("complete", "ready"):
                        self._stage_completed(rule.stage, line_at[f_off])
                    if rule.marks == "ready":
                        self._mark_ready(line_at[f_off])

    def _mark_ready(self, line_no: int) -> None:
        if self._ready_line is None or line_no < self._ready_line:
            self._ready_line = line_no

    def _stage_completed(self, stage: str, line_no: int) -> None:
        ev = self._evidence[stage]
        if ev.completed_at is None or line_no < ev.completed_at:
            ev.completed_at = line_no

    def _stage_seen(self, stage: str, line_no: int) -> None:
        ev = self._evidence.get(stage)
        if ev is None:
            self._evidence[stage] = StageEvidence(line_no, line_no)
        else:
            ev.add(line_no)

    def _line(self, block: bytes, s: int, e: int, line_no: int, anchor_ids: list[int]) -> None:
        raw = block[s:e]
        if anchor_ids and not self._c.prefilter.exact_ids:
            anchor_ids = self._c.prefilter.line_anchor_ids(raw)
        line = parse_line(line_no, raw)
        line = self._tracker.feed(line)
        hints = self._c.hints
        if line.tb_role == "frame":
            if hints.frame and len(self._hint_events) < MAX_HINTS:
                st = hints.frame_stage(line.body)
                if st is not None:
                    self._hint_events.append(
                        HintEvent(line_no, st, line.tb_chain, line.tb_index, True)
                    )
            return
        if line.tb_role in ("header", "separator"):
            return
        if (
            anchor_ids
            and not self._c.hint_ids.isdisjoint(anchor_ids)
            and len(self._hint_events) < MAX_HINTS
        ):
            st = hints.line_stage(line.body)
            if st is not None:
                self._hint_events.append(
                    HintEvent(line_no, st, line.tb_chain, line.tb_index, False)
                )
        if not anchor_ids and line.tb_role not in ("exception", "detail"):
            return
        n_rule = self._c.n_rule_anchors
        ids = [a for a in anchor_ids if a < n_rule]
        hit = self._c.classifier.classify(
            line, ids, shutdown_requested=self._shutdown_line is not None
        )
        if hit is None:
            return
        rule = hit.rule
        if rule.kind == "noise":
            return
        if rule.kind == "milestone":
            # A requested stop is not evidence that its stage (serving) was reached.
            if rule.stage and rule.marks != "shutdown":
                self._stage_seen(rule.stage, line_no)
                if rule.marks in ("complete", "ready"):
                    self._stage_completed(rule.stage, line_no)
            if rule.marks == "ready":
                self._mark_ready(line_no)
            if rule.marks == "shutdown" and self._shutdown_line is None:
                self._shutdown_line = line_no
            return
        if len(self._hits) >= MAX_HITS:
            self._hits_dropped += 1
            return
        if len(line.text) > MAX_KEPT_TEXT:
            # Keep memory bounded: a kept finding never holds more than this of its line.
            cut = f" …[{len(line.text) - MAX_KEPT_TEXT} more characters]"
            short = replace(
                line,
                text=line.text[:MAX_KEPT_TEXT] + cut,
                body=line.body[:MAX_KEPT_TEXT],
            )
            hit = replace(hit, line=short)
        self._hits.append(hit)
        if self.context and rule.kind == "failure" and len(self._context) < MAX_CONTEXTS:
            ctx = _context_around(
                block, s, e, line_no=line_no, n=self.context, lo=self._lo, hi=self._hi
            )
            before = ctx["before"]
            if len(before) < self.context:
                older = [x for x in self._tail if x[0] < line_no - len(before)]
                before[:0] = older[-(self.context - len(before)) :]
            if len(ctx["after"]) < self.context:
                self._pending_after.append((line_no, ctx["after"]))
            self._context[line_no] = ctx


def _context_around(
    block: bytes, s: int, e: int, *, line_no: int, n: int, lo: int, hi: int
) -> dict[str, list[list[Any]]]:
    """Up to ``n`` lines before and after the line ``block[s:e]`` (within ``block[lo:hi]``)."""
    before: list[list[Any]] = []
    pos = s
    for i in range(1, n + 1):
        if pos <= lo:
            break
        b = block.rfind(b"\n", lo, pos - 1) + 1
        if b <= 0:
            b = lo
        before.append([line_no - i, decode_line(block[b : pos - 1])])
        pos = b
    before.reverse()
    after: list[list[Any]] = []
    pos = e + 1
    for i in range(1, n + 1):
        if pos >= hi:
            break
        f = block.find(b"\n", pos, hi)
        if f < 0:
            f = hi
        after.append([line_no + i, decode_line(block[pos:f])])
        pos = f + 1
    return {"before": before, "after": after}


# -- sources -------------------------------------------------------------------------------


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def _is_tar(path: Path) -> bool:
    name = path.name.lower()
    if name.endswith(_BUNDLE_SUFFIXES):
        return True
    if not _is_regular(path):
        return False  # a FIFO or device: probing would consume what it delivers
    try:
        return tarfile.is_tarfile(path)
    except (OSError, EOFError, tarfile.TarError, zlib.error):
        return False


def _bundle_log_stream(path: Path) -> Iterator[bytes]:
    """Stream ``logs/combined.log`` out of a bundle without extracting it."""
    try:
        from kk3evidence.bundle import (
            archive as _bundle,  # written by another module; optional until it lands
        )
    except ImportError:
        _bundle = None  # type: ignore[assignment]
    if _bundle is not None and hasattr(_bundle, "open_bundle"):
        with _bundle.open_bundle(path) as b:
            stream = b.open_member(_LOG_MEMBER)
            try:
                yield from _read_blocks(stream)
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()
        return
    yield from _tar_log_stream(path)


def _tar_log_stream(path: Path) -> Iterator[bytes]:
    try:
        tf = tarfile.open(path, mode="r:*")  # noqa: SIM115 - closed by the with-block below
    except (tarfile.TarError, OSError) as err:
        raise BundleError(f"{path}: not a readable bundle ({err}); check the file") from None
    with tf:
        member = None
        try:
            for m in tf:
                parts = m.name.split("/")
                if len(parts) == 3 and "/".join(parts[1:]) == _LOG_MEMBER and m.isfile():
                    member = m
                    break
        except (tarfile.TarError, OSError, EOFError) as err:
            raise BundleError(f"{path}: corrupt bundle ({err}); check the file") from None
        if member is None:
            raise BundleError(f"{path}: bundle has no {_LOG_MEMBER}; nothing to analyse")
        fh = tf.extractfile(member)
        if fh is None:
            raise BundleError(f"{path}: {_LOG_MEMBER} is not a regular file")
        yield from _read_blocks(fh)


def _read_blocks(fh: IO[bytes] | Any) -> Iterator[bytes]:
    while True:
        try:
            chunk = fh.read(BLOCK_SIZE)
        except (OSError, EOFError, tarfile.TarError) as err:
            raise InputError(f"read error while analysing ({err})") from None
        if not chunk:
            return
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8", errors="replace")
        yield chunk


def _file_blocks(path: Path) -> Iterator[bytes]:
    magic = b""
    if _is_regular(path):
        try:
            with open(path, "rb") as probe:
                magic = probe.read(2)
        except OSError:
            magic = b""
    if magic == b"\x1f\x8b":  # a gzip-compressed plain log (server.log.gz)
        try:
            with gzip.open(path, "rb") as gz:
                yield from _read_blocks(gz)
        except (OSError, EOFError, zlib.error) as err:
            raise InputError(f"{path}: corrupt gzip log ({err}); check the file") from None
        return
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the with-block below
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; give a bundle (.tar/.tar.gz) or a log") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory; give a bundle file or a log file") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror})") from None
    with fh:
        try:
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        yield from _read_blocks(fh)


def _iter_lines_as_blocks(lines: Iterable[str | bytes]) -> Iterator[bytes]:
    buf: list[bytes] = []
    size = 0
    for ln in lines:
        b = ln.encode("utf-8", errors="surrogateescape") if isinstance(ln, str) else bytes(ln)
        if not b.endswith(b"\n"):
            b += b"\n"
        buf.append(b)
        size += len(b)
        if size >= BLOCK_SIZE:
            yield b"".join(buf)
            buf.clear()
            size = 0
    if buf:
        yield b"".join(buf)


def _blocks_for(source: object) -> tuple[str, Iterator[bytes]]:
    if isinstance(source, str | os.PathLike):
        s = os.fspath(source)
        if isinstance(s, bytes):
            s = s.decode("utf-8", errors="replace")
        if s == "-":
            return "-", _read_blocks(sys.stdin.buffer)
        path = Path(s)
        if not path.exists():
            raise InputError(f"{s}: no such file; give a bundle (.tar/.tar.gz) or a log file")
        if path.is_dir():
            raise InputError(f"{s}: is a directory; give a bundle file or a log file")
        if _is_tar(path):
            return s, _bundle_log_stream(path)
        return s, _file_blocks(path)
    if isinstance(source, bytes | bytearray | memoryview):
        return "<bytes>", iter([bytes(source)])
    if hasattr(source, "read"):
        name = getattr(source, "name", None)
        label = name if isinstance(name, str) else "<stream>"
        if isinstance(source, io.TextIOBase):
            return label, _read_blocks(source)
        return label, _read_blocks(source)
    if isinstance(source, Iterable):
        return "<lines>", _iter_lines_as_blocks(source)
    raise InputError(
        f"cannot analyse a {type(source).__name__}; give a path, '-', a binary file or lines"
    )


def analyze(
    source: object,
    *,
    ruleset: RuleSet | None = None,
    label: str | None = None,
    engine: str | None = None,
    context: int = 3,
    stall_inputs: StallInputs | None = None,
) -> Analysis:
    """Analyse a bundle path (.tar/.tar.gz/.tgz), a log path, ``"-"`` (stdin), a binary file
    object, raw bytes, or an iterable of ``str``/``bytes`` lines.

    Raises :class:`~kk3evidence.errors.InputError` (or ``BundleError``) for unreadable input;
    never a traceback for the content of a log. ``stall_inputs`` (a capture in progress) or a
    bundle's own members add stage durations and stall snapshots (:mod:`.hang`).
    """
    name, blocks = _blocks_for(source)
    eng = AnalysisEngine(label or name, ruleset, engine=engine, context=context)
    scan = HangScan()
    for block in blocks:
        eng.feed(block)
        scan.feed(block)
    return apply_hang(eng.finish(), scan, stall_inputs or bundle_stall_inputs(source))
