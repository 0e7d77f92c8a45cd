"""First causal failure, consequences and the stage timeline (SPEC §2, §4).

Definitions used here (documented in docs/rules-format.md):

* A **root** is a failure line not explained by an earlier one. A failure line is instead a
  *consequence* when (a) an earlier failure has the same rule (the same cause repeated by
  another rank/process or re-printed by a parent process), (b) it is a later exception of a
  chained traceback whose earlier exception was already classified, (c) it comes from a
  fallback rule (an unrecognised exception) after a recognised failure, or (d) it is an OOM,
  compile or "other" failure after an earlier CUDA/driver/NCCL/illegal-memory failure.
* Consequence rules (``kind = "consequence"``) never become the first failure while any root
  exists.
* The **first failure** is the earliest root of severity ``fatal``/``error``; a run with only
  warning-severity roots and no consequence line has no first failure.
* After a requested shutdown (a ``marks = "shutdown"`` milestone: SIGINT, "shutdown triggered"),
  consequence lines with no earlier failure and fallback exceptions are shutdown noise.
* Stage time order (how vLLM really proceeds) differs from the SPEC table order: the
  communication group forms before weights load. :data:`TIME_ORDER` is used to decide which
  stages a run provably passed; the ``stages`` list itself is reported in SPEC order.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kk3evidence.analysis.classify import Classified
from kk3evidence.analysis.rules import StageHints
from kk3evidence.model import STAGES, Finding, StageSpan, StageStatus

__all__ = ["TIME_ORDER", "HintEvent", "Resolution", "StageEvidence", "resolve", "stage_in_progress"]

TIME_ORDER: tuple[str, ...] = (
    "container_init",
    "device_discovery",
    "comm_group",
    "weights_access",
    "engine_init",
    "api_ready",
    "serving",
)
_T = {s: i for i, s in enumerate(TIME_ORDER)}

# Category of a later failure -> categories of earlier failures that explain it.
_AFTERMATH: dict[str, frozenset[str]] = {
    "oom": frozenset({"cuda_init", "driver_mismatch", "nccl", "illegal_memory"}),
    "compile": frozenset({"cuda_init", "driver_mismatch", "illegal_memory"}),
    "other": frozenset({"cuda_init", "driver_mismatch", "nccl", "illegal_memory", "oom"}),
    "nccl": frozenset({"cuda_init", "driver_mismatch", "illegal_memory"}),
}
_SERIOUS = frozenset({"fatal", "error"})
# Categories whose failures can strike in any stage (their rule's stage is only the usual one).
_ANY_STAGE = frozenset({"oom", "illegal_memory", "other"})


@dataclass(frozen=True, slots=True)
class HintEvent:
    """A line that hints where a nearby failure happened (``rules/stage-hints.toml``)."""

    line_no: int
    stage: str
    chain: int | None  # traceback chain of a frame (or of the line), if any
    index: int  # position of its traceback in the chain
    frame: bool  # a traceback frame (else a nearby line)


@dataclass(slots=True)
class StageEvidence:
    first_line: int
    last_line: int
    completed_at: int | None = None

    def add(self, line_no: int) -> None:
        self.first_line = min(self.first_line, line_no)
        self.last_line = max(self.last_line, line_no)


@dataclass(frozen=True, slots=True)
class Resolution:
    first_failure: Finding | None
    consequences: tuple[Finding, ...]
    findings: tuple[Finding, ...]
    stages: tuple[StageSpan, ...]
    last_stage_reached: str | None
    first_captures: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


def stage_in_progress(
    line_no: int, evidence: dict[str, StageEvidence], default: str | None = None
) -> str:
    """The furthest stage (time order) whose first evidence is before ``line_no``; after the
    API server is ready, the run is serving. With no evidence at all: ``default`` (the rule's
    own stage) or ``container_init``."""
    seen = [s for s, ev in evidence.items() if ev.first_line < line_no]
    if not seen:
        return default or "container_init"
    best = max(seen, key=lambda s: _T[s])
    if best == "api_ready":
        ev = evidence["api_ready"]
        if ev.completed_at is not None and ev.completed_at < line_no:
            best = "serving"
    return best


def _exc_text(body: str) -> str:
    """``"pkg.mod.ValueError: msg"`` -> ``"msg"`` (for echo detection across re-prints)."""
    head, sep, tail = body.strip().partition(": ")
    if sep and " " not in head:
        return tail.strip()
    return body.strip()


#: lines between an exception line and its detail line for the detail to count as its reason
_DETAIL_SPAN = 3


def _specific_over_wrapper(hits: Sequence[Classified], notes: list[str]) -> list[Classified]:
    """A generic exception line (``pydantic ValidationError: 1 validation error for X``) whose
    own detail line right below matched a specific rule of the same category (``max_model_len
    … greater than the derived max_model_len``): the exception line stays the first causal
    line (it is where the failure starts), classified by the specific rule, and the detail line
    is not listed again as a separate failure."""
    out: list[Classified] = []
    skip = -1
    for i, h in enumerate(hits):
        if i == skip:
            continue
        ln = h.line
        nxt = hits[i + 1] if i + 1 < len(hits) else None
        if (nxt is not None and ln.tb_role == "exception" and nxt.line.tb_role == "detail"
                and ln.tb_chain is not None and nxt.line.tb_chain == ln.tb_chain
                and nxt.line.tb_index == ln.tb_index and h.rule.kind == "failure"
                and nxt.rule.kind == "failure" and nxt.rule.id != h.rule.id
                and nxt.rule.category == h.rule.category and not nxt.rule.fallback
                and 0 < nxt.line.line_no - ln.line_no <= _DETAIL_SPAN):
            notes.append(f"line {ln.line_no}: the generic {h.rule.id} is classified by the "
                         f"specific {nxt.rule.id} of its detail line {nxt.line.line_no}")
            out.append(replace(h, rule=nxt.rule, captures=nxt.captures))
            skip = i + 1
            continue
        out.append(h)
    return out


def resolve(
    hits: Sequence[Classified],
    evidence: dict[str, StageEvidence],
    *,
    shutdown_line: int | None = None,
    ready_line: int | None = None,
    chain_links: dict[int, list[str | None]] | None = None,
    completable: frozenset[str] = frozenset(),
    hints: Sequence[HintEvent] = (),
    policy: StageHints | None = None,
) -> Resolution:
    """Decide roots, consequences and the first failure from the classified lines.

    ``ready_line`` is the first line showing the server answering (``marks = "ready"``);
    ``completable`` the stages that have completion milestones (a failure while one of them is
    in progress belongs to it, see :func:`_failure_stage`)."""
    links = chain_links or {}
    notes: list[str] = []
    hits = _specific_over_wrapper(hits, notes)
    # Drop fallback exceptions that a "During handling…" chain superseded (the outer one is what
    # propagated), keeping those that are the direct cause of the next one.
    kept: list[Classified] = []
    for h in hits:
        ln = h.line
        if h.rule.fallback and ln.tb_chain is not None:
            chain = links.get(ln.tb_chain, [])
            nxt = ln.tb_index + 1
            if nxt < len(chain) and chain[nxt] == "context":
                continue
        kept.append(h)

    stage_of: dict[int, str] = {}
    serving = evidence.get("serving")
    ready_at = ready_line
    if serving is not None and (ready_at is None or serving.first_line < ready_at):
        ready_at = serving.first_line
    pol = policy if policy is not None else StageHints()
    index = HintIndex(hints)
    for h in kept:
        stage = _failure_stage(h, evidence, ready_at, completable, hints=index, policy=pol)
        if stage is not None:
            stage_of[h.line.line_no] = stage

    roots: list[Classified] = []
    first_by_rule: dict[str, Classified] = {}
    chain_first: dict[int, Classified] = {}
    texts: dict[str, Classified] = {}
    kind_of: dict[int, str] = {}
    cause_of: dict[int, int | None] = {}
    dropped: set[int] = set()

    for h in kept:
        ln = h.line
        no = ln.line_no
        r = h.rule
        after_shutdown = shutdown_line is not None and no > shutdown_line
        if r.kind == "consequence":
            if after_shutdown and not roots:
                dropped.add(no)
                continue
            cause = _pick_cause(r.consequence_of, roots)
            kind_of[no] = "consequence"
            cause_of[no] = cause.line.line_no if cause else None
        else:
            cause = None
            if r.id in first_by_rule:
                cause = first_by_rule[r.id]
            elif ln.tb_chain is not None and ln.tb_index > 0 and ln.tb_chain in chain_first:
                cause = chain_first[ln.tb_chain]
            elif r.fallback:
                if after_shutdown and not roots:
                    dropped.add(no)
                    continue
                cause = texts.get(_exc_text(ln.body)) or (roots[0] if roots else None)
            elif r.category in _AFTERMATH:
                for root in roots:
                    if root.rule.category in _AFTERMATH[r.category]:
                        cause = root
                        break
            if cause is None:
                roots.append(h)
                kind_of[no] = "failure"
                cause_of[no] = None
            else:
                kind_of[no] = "consequence"
                cause_of[no] = _root_line(cause, cause_of)
        first_by_rule.setdefault(r.id, h)
        if ln.tb_chain is not None:
            chain_first.setdefault(ln.tb_chain, h)
        texts.setdefault(_exc_text(ln.body), h)

    live = [h for h in kept if h.line.line_no not in dropped]
    serious_roots = [h for h in roots if h.rule.severity in _SERIOUS]
    has_consequence = any(kind_of[h.line.line_no] == "consequence" for h in live)
    first: Classified | None = None
    if serious_roots:
        first = serious_roots[0]
    elif roots and has_consequence:
        first = roots[0]
    elif has_consequence:
        first = next(h for h in live if kind_of[h.line.line_no] == "consequence")
        notes.append(
            "only consequence lines were recognised; the root cause was not matched by any rule"
        )

    first_no = first.line.line_no if first else None
    findings: list[Finding] = []
    consequences: list[Finding] = []
    for h in live:
        no = h.line.line_no
        kind = kind_of[no]
        caused = cause_of.get(no)
        if kind == "consequence" and caused is None and first_no is not None and no != first_no:
            caused = first_no
        f = h.finding(stage=stage_of.get(no), kind=kind, caused_by=caused)
        findings.append(f)
        if kind == "consequence" and no != first_no:
            consequences.append(f)

    first_finding: Finding | None = None
    if first is not None:
        first_finding = next(f for f in findings if f.line_no == first_no)

    stages, last = _stages(evidence, first_finding, shutdown_line)
    return Resolution(
        first_failure=first_finding,
        consequences=tuple(consequences),
        findings=tuple(findings),
        stages=stages,
        last_stage_reached=last,
        first_captures=dict(first.captures) if first else {},
        notes=tuple(notes),
    )


def _failure_stage(
    h: Classified,
    evidence: dict[str, StageEvidence],
    ready_at: int | None,
    completable: frozenset[str],
    *,
    hints: HintIndex | None = None,
    policy: StageHints | None = None,
) -> str | None:
    """The stage a failure line belongs to when it is not simply its rule's stage.

    * After the server answered (health 200, requests served) whatever fails is ``serving``.
    * A context-dependent failure (``rules/stage-hints.toml``) takes the stage its hints point
      at (a serving hint only when no start-up stage is visibly unfinished).
    * A fallback exception takes the stage in progress.
    * A failure of a stage-agnostic category (OOM, illegal memory access, other) whose rule
      names a later stage than the one in progress, while that one (with completion
      milestones: weights, engine, API) has started and not completed, belongs to the stage in
      progress (an OOM while weights load is a weights_access failure; a KV-cache or config
      error keeps its rule's stage).
    """
    no = h.line.line_no
    r = h.rule
    if ready_at is not None and ready_at < no:
        return "serving"
    pol = policy if policy is not None else StageHints()
    if (
        hints is not None
        and hints.events
        and r.id not in pol.fixed_rules
        and (r.category in pol.context_categories or r.fallback)
    ):
        hinted = hinted_stage(h, hints, pol)
        if hinted == "serving" and _start_up_unfinished(no, evidence, completable):
            # Serving code (execute_model) also runs while the engine warms up: when the log
            # shows a start-up stage begun and not finished, the milestones decide.
            hinted = None
        if hinted is not None:
            return hinted
    if (r.fallback and r.scope == "exception") or not r.stage:
        return stage_in_progress(no, evidence, default=r.stage)
    seen = [s for s, ev in evidence.items() if ev.first_line < no]
    if not seen:
        return None
    cur = max(seen, key=lambda s: _T[s])
    ev = evidence[cur]
    unfinished = ev.completed_at is None or ev.completed_at > no
    if r.category in _ANY_STAGE and cur in completable and unfinished and _T[cur] < _T[r.stage]:
        return cur
    return None


def _start_up_unfinished(
    no: int, evidence: dict[str, StageEvidence], completable: frozenset[str]
) -> bool:
    """A start-up stage with a completion milestone began before ``no`` and had not completed."""
    return any(
        stage in completable
        and stage != "serving"
        and ev.first_line < no
        and (ev.completed_at is None or ev.completed_at > no)
        for stage, ev in evidence.items()
    )


class HintIndex:
    """Hint events indexed for lookups around many failures (built once per resolve)."""

    __slots__ = ("by_chain", "events", "lines")

    def __init__(self, hints: Sequence[HintEvent]) -> None:
        self.events = sorted(hints, key=lambda e: e.line_no)
        self.lines = [e.line_no for e in self.events]
        self.by_chain: dict[int, list[HintEvent]] = {}
        for ev in self.events:
            if ev.frame and ev.chain is not None:
                self.by_chain.setdefault(ev.chain, []).append(ev)

    def around(self, lo: int, hi: int) -> list[HintEvent]:
        return self.events[bisect.bisect_left(self.lines, lo) : bisect.bisect_right(self.lines, hi)]


def hinted_stage(
    h: Classified, hints: HintIndex | Sequence[HintEvent], policy: StageHints
) -> str | None:
    """The stage the hints around a failure line point at (precedence in
    ``rules/stage-hints.toml``): the innermost start-up frame of the failing traceback, else
    the nearest start-up line hint, else ``serving`` when only serving hints are there."""
    index = hints if isinstance(hints, HintIndex) else HintIndex(hints)
    ln = h.line
    no = ln.line_no
    chain = ln.tb_chain
    # Frames of the failing exception's own traceback chain, then the lines around it.
    own = index.by_chain.get(chain, []) if chain is not None else []
    near = [
        e
        for e in index.around(no - policy.window_before, no + policy.window_after)
        if chain is None or not (e.frame and e.chain == chain)
    ]
    start = [e for e in own if e.stage != "serving"]
    if start:
        # Innermost: the first traceback of the chain, its last hinted frame.
        first_index = min(e.index for e in start)
        return [e for e in start if e.index == first_index][-1].stage
    start = [e for e in near if e.stage != "serving"]
    if start:
        # Nearest (the failing traceback's frames follow or precede the line).
        return min(start, key=lambda e: (abs(e.line_no - no), e.line_no)).stage
    if any(e.stage == "serving" for e in own) or any(e.stage == "serving" for e in near):
        return "serving"
    return None


def _pick_cause(cats: frozenset[str] | None, roots: list[Classified]) -> Classified | None:
    if not roots:
        return None
    if cats:
        for root in reversed(roots):
            if root.rule.category in cats:
                return root
    return roots[0]


def _root_line(cause: Classified, cause_of: dict[int, int | None]) -> int:
    no = cause.line.line_no
    seen = 0
    while cause_of.get(no) is not None and seen < 64:
        nxt = cause_of[no]
        assert nxt is not None
        no = nxt
        seen += 1
    return no


def _stage_done(
    stage: str, e: StageEvidence, evidence: dict[str, StageEvidence], first: Finding | None
) -> bool:
    """Completed: its own completion milestone came before the first failure, or a stage that
    follows it in time order was reached before the first failure."""
    if e.completed_at is not None and (first is None or e.completed_at < first.line_no):
        return True
    return any(
        _T[o] > _T[stage] and (first is None or ev.first_line < first.line_no)
        for o, ev in evidence.items()
    )


def _stages(
    evidence: dict[str, StageEvidence],
    first: Finding | None,
    shutdown_line: int | None,
) -> tuple[tuple[StageSpan, ...], str | None]:
    ev: dict[str, StageEvidence] = {
        s: StageEvidence(e.first_line, e.last_line, e.completed_at) for s, e in evidence.items()
    }
    if first is not None:
        if first.stage in ev:
            ev[first.stage].add(first.line_no)
        else:
            ev[first.stage] = StageEvidence(first.line_no, first.line_no)
    if not ev:
        return (), None
    last = max(ev, key=lambda s: _T[s])
    spans: list[StageSpan] = []
    status: StageStatus
    for stage in STAGES:
        if stage not in ev:
            continue
        e = ev[stage]
        if first is not None and first.stage == stage:
            status = "failed"
        elif _stage_done(stage, e, evidence, first) or (
            stage == "serving" and first is None and shutdown_line is not None
        ):
            status = "completed"
        else:
            status = "started"
        spans.append(StageSpan(stage, status, e.first_line, e.last_line))
    return tuple(spans), last
