"""First causal failure, consequences and the stage timeline (SPEC §2, §4).

Definitions used here (documented in docs/rules-format.md):

* A **root** is a failure line not explained by an earlier one. A failure line is instead a
  *consequence* when (a) an earlier failure has the same rule (the same cause repeated by
  another rank/process or re-printed by a parent process), (b) it is a later exception of a
  chained traceback whose earlier exception was already classified, (c) it comes from a
  fallback rule (an unrecognised exception) after a recognised failure of severity
  ``fatal``/``error`` (unless every earlier such root is a fallback of weaker ``evidence``: then
  it is a root too, and ranked; a warning such as a KV-cache preemption explains no
  exception), or (d) it is
  an OOM, compile or "other" failure after an earlier CUDA/driver/NCCL/illegal-memory failure.
* Consequence rules (``kind = "consequence"``) never become the first failure while any root
  exists.
* The **first failure** is the earliest root of severity ``fatal``/``error`` (when every such
  root is a fallback, the one with the strongest ``evidence`` rank, earliest among equals; its
  ``basis`` is then ``"fallback"``); a run with only warning-severity roots and no consequence
  line has no first failure.
* After a requested shutdown (a ``marks = "shutdown"`` milestone: SIGINT, "shutdown triggered"),
  consequence lines with no earlier failure and fallback exceptions are shutdown noise.
* Stage time order (how vLLM really proceeds) differs from the SPEC table order: the
  communication group forms before weights load. :data:`TIME_ORDER` is used to decide which
  stages a run provably passed; the ``stages`` list itself is reported in SPEC order.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kk3evidence.analysis.classify import Classified
from kk3evidence.analysis.grammar import LogLine
from kk3evidence.analysis.rules import DEVICE_CAUSE, UNREADY, StageHints, raised_class
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
    # SPEC §2: a timeout after another rank or process stated a failure is its consequence.
    "hang": frozenset(
        {
            "cuda_init",
            "driver_mismatch",
            "nccl",
            "oom",
            "kv_cache",
            "prefix_cache",
            "weights",
            "config",
            "port",
            "compile",
            "illegal_memory",
            "other",
        }
    ),
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
    """``"pkg.mod.ValueError: msg"`` -> ``"msg"`` (for echo detection across re-prints); the
    exception's repr as a logger prints it, ``"RuntimeError('msg')"``, is the same ``"msg"``
    (V0's MQ client logs ``repr(e)`` and then the traceback ending in ``RuntimeError: msg``)."""
    stripped = body.strip()
    m = _EXC_REPR_RE.match(stripped)
    if m is not None:
        return m.group(2).strip()
    head, sep, tail = stripped.partition(": ")
    if sep and " " not in head:
        return tail.strip()
    return stripped


# `RuntimeError('Engine loop has died')`, `ValueError("x")`: the repr of an exception
_EXC_REPR_RE = re.compile(
    r"""^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)\((['"])(.*)\1\)$"""
)


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


# Ray's driver-side wrapper of a remote failure: `RayTaskError(KeyError): ray::Actor.method()`,
# then the remote frames, then the remote `KeyError: …` line (label rule 8, corpus/README.md).
_RAY_WRAPPER_RE = re.compile(r"RayTaskError\((\w+)\): ")
_REMOTE_SPAN = 400  # lines from the wrapper to the remote exception line it announces


def _wrapper_over_remote(hits: Sequence[Classified], notes: list[str]) -> list[Classified]:
    """Ray's ``RayTaskError(X)`` line states the failure first (it names the class): it stays
    the first causal line, classified by the remote ``X: …`` exception line that ends its
    traceback (which is not listed again). A worker's own earlier printing of the exception
    is earlier in the log and stays first."""
    out: list[Classified] = []
    taken: set[int] = set()
    for i, h in enumerate(hits):
        if i in taken:
            continue
        m = _RAY_WRAPPER_RE.search(h.line.body)
        inner = None
        if m is not None:
            inner = next(
                (j for j in range(i + 1, len(hits))
                 if hits[j].line.line_no - h.line.line_no <= _REMOTE_SPAN
                 and hits[j].line.tb_role == "exception"
                 and raised_class(hits[j].line.body) == m.group(1)
                 and _RAY_WRAPPER_RE.search(hits[j].line.body) is None),
                None,
            )
        if inner is None:
            out.append(h)
            continue
        r = hits[inner]
        notes.append(f"line {h.line.line_no}: Ray's wrapper is classified by the remote "
                     f"{m.group(1) if m else ''} of line {r.line.line_no}")
        out.append(replace(h, rule=r.rule, captures=r.captures))
        taken.add(inner)
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
    category_hints: Sequence[HintEvent] = (),
    word_category: Callable[[str], str | None] | None = None,
) -> Resolution:
    """Decide roots, consequences and the first failure from the classified lines.

    ``ready_line`` is the first line showing the server answering (``marks = "ready"``);
    ``completable`` the stages that have completion milestones (a failure while one of them is
    in progress belongs to it, see :func:`_failure_stage`)."""
    notes: list[str] = []
    kept = _drop_provisional(
        _drop_superseded(
            _wrapper_over_remote(_specific_over_wrapper(hits, notes), notes), chain_links or {}
        )
    )
    pol = policy if policy is not None else StageHints()
    stage_of = _stages_of(
        kept, evidence, ready_line, completable, index=HintIndex(hints), policy=pol
    )
    cat_of = _context_categories(
        kept, HintIndex(category_hints), pol, word_category, stage_of=stage_of
    )
    links = _link(kept, shutdown_line)
    live = [h for h in kept if h.line.line_no not in links.dropped]
    first = _first_failure(links, live, notes)
    first_no = first.line.line_no if first else None
    findings, consequences = _findings(live, links, first_no, stage_of, cat_of)
    # No rule knew the cause of a fallback first failure: the best evidence stands in for it.
    unknown = first is not None and (
        first.rule.fallback or links.kind_of[first_no or 0] == "consequence"
    )
    findings, first_finding = _first_with_basis(findings, first_no, unknown)
    findings, consequences, first_finding = _fold_ranks(live, findings, consequences, first_finding)
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


# An error a fallback line states and says it will try again (`Error retrieving file list: …,
# retrying 1 of 2`): it may succeed; a later failure is the stronger candidate.
_RETRY_RE = re.compile(r"\b(?:retrying|will retry|retry \d+ of \d+)\b", re.IGNORECASE)


def _provisional(h: Classified) -> bool:
    """A fallback failure the log itself marks as not final: printed by a logger at WARNING (a
    traceback logged with ``logger.warning(..., exc_info=True)``: vLLM's optional imports, a
    kernel it could not build), or saying it will retry."""
    if not h.rule.fallback or h.rule.kind != "failure":
        return False
    return h.line.level == "WARNING" or _RETRY_RE.search(h.line.body) is not None


# A failure "concerns the device" when its text names it (a later failure a GPU-less process
# explains: `Device string must not be empty`, `No CUDA GPUs are available`).
_DEVICE_RE = re.compile(r"\b(?:cuda|gpus?|device|nvml|driver)\b", re.IGNORECASE)


def _concerns_device(h: Classified) -> bool:
    return h.rule.category in ("cuda_init", "driver_mismatch") or bool(
        _DEVICE_RE.search(h.line.body)
    )


def _drop_provisional(hits: list[Classified]) -> list[Classified]:
    """Drop provisional fallback failures (:func:`_provisional`) when a failure that is not
    provisional follows: the run went on past them, so they neither are the cause nor explain
    what failed later. Alone, they stay (label rule 4: a warning that states the failure first
    counts). A rule failure with ``when = "device_cause"`` (a process that sees no GPU) is
    dropped only when the next firm failure after it does not concern the device: a GPU-less
    Ray driver or benchmark client that later fails for another reason."""
    firm = [
        i for i, h in enumerate(hits)
        if h.rule.kind == "failure" and not _provisional(h) and h.rule.when != DEVICE_CAUSE
    ]
    if not firm:
        return hits
    last = max(firm)

    def dropped(i: int, h: Classified) -> bool:
        if i >= last:
            return False
        if h.rule.when == DEVICE_CAUSE and h.rule.kind == "failure":
            after = hits[next(j for j in firm if j > i)]
            return not _concerns_device(after)
        return _provisional(h)

    return [h for i, h in enumerate(hits) if not dropped(i, h)]


def _drop_superseded(
    hits: Sequence[Classified], links: dict[int, list[str | None]]
) -> list[Classified]:
    """Drop fallback exceptions that a "During handling…" chain superseded (the outer one is
    what propagated), keeping those that are the direct cause of the next one, and those
    whose superseding exception the log never shows (cut inside the next traceback's frames:
    the inner exception is the only failure stated)."""
    last_index: dict[int, int] = {}
    for h in hits:
        ln = h.line
        if ln.tb_chain is not None and ln.tb_index > last_index.get(ln.tb_chain, -1):
            last_index[ln.tb_chain] = ln.tb_index
    kept: list[Classified] = []
    for h in hits:
        ln = h.line
        if h.rule.fallback and ln.tb_chain is not None:
            chain = links.get(ln.tb_chain, [])
            nxt = ln.tb_index + 1
            if (
                nxt < len(chain)
                and chain[nxt] == "context"
                and last_index.get(ln.tb_chain, -1) >= nxt
            ):
                continue
        kept.append(h)
    return kept


def _stages_of(
    kept: Sequence[Classified],
    evidence: dict[str, StageEvidence],
    ready_line: int | None,
    completable: frozenset[str],
    *,
    index: HintIndex,
    policy: StageHints,
) -> dict[int, str]:
    """Line -> stage for the failures whose stage is not simply their rule's."""
    serving = evidence.get("serving")
    ready_at = ready_line
    if serving is not None and (ready_at is None or serving.first_line < ready_at):
        ready_at = serving.first_line
    stage_of: dict[int, str] = {}
    for h in kept:
        stage = _failure_stage(h, evidence, ready_at, completable, hints=index, policy=policy)
        if stage is not None:
            stage_of[h.line.line_no] = stage
    return stage_of


@dataclass(slots=True)
class _Links:
    """Each failure line's kind (``failure`` root or ``consequence``) and root cause line."""

    roots: list[Classified] = field(default_factory=list)
    kind_of: dict[int, str] = field(default_factory=dict)
    cause_of: dict[int, int | None] = field(default_factory=dict)
    dropped: set[int] = field(default_factory=set)  # shutdown noise


def _link(kept: Sequence[Classified], shutdown_line: int | None) -> _Links:
    """Walk the failures in log order: each is a root or the consequence of an earlier one."""
    out = _Links()
    roots = out.roots
    first_by_rule: dict[str, Classified] = {}
    chain_first: dict[int, Classified] = {}
    texts: dict[str, Classified] = {}
    for h in kept:
        ln = h.line
        no = ln.line_no
        r = h.rule
        after_shutdown = shutdown_line is not None and no > shutdown_line
        if r.kind == "consequence":
            if after_shutdown and not roots:
                out.dropped.add(no)
                continue
            cause = _pick_cause(r.consequence_of, roots)
            out.kind_of[no] = "consequence"
            out.cause_of[no] = cause.line.line_no if cause else None
        else:
            cause = _same_cause(h, first_by_rule, chain_first)
            if cause is None and r.fallback and after_shutdown and not roots:
                out.dropped.add(no)  # shutdown noise
                continue
            if cause is None:
                cause = _earlier_cause(h, roots, texts)
            if cause is None:
                roots.append(h)
                out.kind_of[no] = "failure"
                out.cause_of[no] = None
            else:
                out.kind_of[no] = "consequence"
                out.cause_of[no] = _root_line(cause, out.cause_of)
        first_by_rule.setdefault(r.id, h)
        if ln.tb_chain is not None:
            chain_first.setdefault(ln.tb_chain, h)
        texts.setdefault(_exc_text(ln.body), h)
    return out


def _same_cause(
    h: Classified, first_by_rule: dict[str, Classified], chain_first: dict[int, Classified]
) -> Classified | None:
    """An earlier line of the same rule, or the first exception of the same traceback chain."""
    ln = h.line
    if h.rule.id in first_by_rule:
        return first_by_rule[h.rule.id]
    if ln.tb_chain is not None and ln.tb_index > 0 and ln.tb_chain in chain_first:
        return chain_first[ln.tb_chain]
    return None


def _earlier_cause(
    h: Classified, roots: list[Classified], texts: dict[str, Classified]
) -> Classified | None:
    """For a fallback: the same exception text printed before, else the first root (unless
    it outranks every root); for an aftermath category: the first root that explains it."""
    r = h.rule
    if r.fallback:
        cause = texts.get(_exc_text(h.line.body))
        # a KV-cache preemption notice (a warning about throughput) explains no exception; a
        # warning that announces a crash (prefix caching forced on) still does
        serious = [x for x in roots if not _notice(x)]
        if cause is None and serious and not _outranks(h, serious):
            cause = serious[0]
        return cause
    if r.category in _AFTERMATH:
        for root in roots:
            if r.category == "hang" and root.rule.severity not in _SERIOUS:
                continue  # a warning does not explain a timeout
            if root.rule.category in _AFTERMATH[r.category]:
                return root
    return None


def _first_failure(links: _Links, live: list[Classified], notes: list[str]) -> Classified | None:
    """The first causal failure: the best serious root, else the first root or consequence
    when consequences were seen (a note says when only consequences were recognised)."""
    roots = links.roots
    serious_roots = [h for h in roots if h.rule.severity in _SERIOUS]
    has_consequence = any(links.kind_of[h.line.line_no] == "consequence" for h in live)
    if serious_roots:
        survived = _survived_fallback(serious_roots, live)
        if survived is not None:
            return survived
        best = _best_root(serious_roots)
        if best.rule.fallback and best.rule.evidence >= _END_EVIDENCE:
            # only the end of a process is known (a fatal signal, an exit status): a line
            # before it that reports a failure whose cause the log does not show says more
            # (`terminate called after throwing an instance of 'sycl::_V1::exception'`, its
            # `what():`, then `Aborted (core dumped)`)
            orphan = next(
                (
                    h
                    for h in live
                    if h.line.line_no < best.line.line_no
                    and links.kind_of[h.line.line_no] == "consequence"
                    and links.cause_of.get(h.line.line_no) is None
                ),
                None,
            )
            if orphan is not None:
                return orphan
        return best
    if roots and has_consequence:
        return roots[0]
    if has_consequence:
        notes.append(
            "only consequence lines were recognised; the root cause was not matched by any rule"
        )
        return next(h for h in live if links.kind_of[h.line.line_no] == "consequence")
    return None


def _findings(
    live: list[Classified],
    links: _Links,
    first_no: int | None,
    stage_of: dict[int, str],
    cat_of: dict[int, str],
) -> tuple[list[Finding], list[Finding]]:
    """Every live failure line as a finding, and the consequences among them."""
    findings: list[Finding] = []
    consequences: list[Finding] = []
    for h in live:
        no = h.line.line_no
        kind = links.kind_of[no]
        caused = links.cause_of.get(no)
        if kind == "consequence" and caused is None and first_no is not None and no != first_no:
            caused = first_no
        f = h.finding(stage=stage_of.get(no), kind=kind, caused_by=caused, category=cat_of.get(no))
        findings.append(f)
        if kind == "consequence" and no != first_no:
            consequences.append(f)
    return findings, consequences


def _first_with_basis(
    findings: list[Finding], first_no: int | None, unknown: bool
) -> tuple[list[Finding], Finding | None]:
    """The first failure's finding, with ``basis = "fallback"`` when no rule knew it."""
    if first_no is None:
        return findings, None
    first = next(f for f in findings if f.line_no == first_no)
    if not unknown:
        return findings, first
    first = replace(first, basis="fallback")
    return [first if f.line_no == first_no else f for f in findings], first


_DIGITS = re.compile(r"\d+")


def _rank_label(h: Classified) -> str | None:
    ln = h.line
    return f"rank{ln.rank}" if ln.rank is not None else ln.process


def _fold_ranks(
    live: Sequence[Classified],
    findings: list[Finding],
    consequences: list[Finding],
    first: Finding | None,
) -> tuple[list[Finding], list[Finding], Finding | None]:
    """Many ranks, one finding: the same line (same rule, same words once numbers are masked)
    printed by several ranks or processes becomes one finding carrying the rank list; the
    other copies leave ``findings`` and ``consequences`` (their lines stay in ``folded``)."""
    labels = {h.line.line_no: _rank_label(h) for h in live}
    bodies = {h.line.line_no: h.line.body for h in live}
    per_rule: dict[str, set[str]] = {}
    for f in findings:
        lab = labels.get(f.line_no)
        if lab is not None:
            per_rule.setdefault(f.rule, set()).add(lab)
    groups: dict[tuple[str, str, str], list[Finding]] = {}
    masked: dict[str, str] = {}  # body -> its words with numbers masked (ranks repeat bodies)
    for f in findings:
        if labels.get(f.line_no) is None or len(per_rule.get(f.rule, ())) < 2:
            continue  # one rank only for this rule: nothing to fold
        body = bodies.get(f.line_no, f.text)
        words = masked.get(body)
        if words is None:
            words = masked[body] = _DIGITS.sub("#", body.strip())
        groups.setdefault(
            (f.rule, f.kind if f.kind != "consequence" else "failure", words), []
        ).append(f)
    folded: dict[int, Finding] = {}  # head line -> new head
    drop: set[int] = set()
    for members in groups.values():
        ranks = list(dict.fromkeys(labels[m.line_no] or "" for m in members))
        if len(ranks) < 2:
            continue
        head, rest = members[0], members[1:]
        if first is not None and any(m.line_no == first.line_no for m in rest):
            continue  # never fold the first causal failure away
        folded[head.line_no] = replace(
            head, ranks=tuple(ranks), folded=tuple(m.line_no for m in rest)
        )
        drop.update(m.line_no for m in rest)
    if not folded:
        return findings, consequences, first
    new_findings = [folded.get(f.line_no, f) for f in findings if f.line_no not in drop]
    new_cons = [folded.get(c.line_no, c) for c in consequences if c.line_no not in drop]
    if first is not None:
        first = folded.get(first.line_no, first)
    return new_findings, new_cons, first


def _context_categories(
    kept: Sequence[Classified],
    index: HintIndex,
    policy: StageHints,
    word_category: Callable[[str], str | None] | None = None,
    *,
    stage_of: Mapping[int, str] | None = None,
) -> dict[int, str]:
    """Line -> category for failures (and consequences, which stand in for an unstated cause)
    whose rule's category the context may replace
    (``category_context`` in ``rules/stage-hints.toml``): the failure line's own words first
    (``self``), then the frames of its traceback (innermost first), then the family words of
    the line (``words``), then the nearest hinted line; for a fallback (no rule's grammar
    matched the line) last the rule set's own words in the line (``word_category``: anchors of
    specific rules that all name one category), the component that printed it, and the class
    of the exception it raises (``exception``; not while serving, where a refused value is
    mostly one request's, ``stage_of``)."""
    if not policy.category_context:
        return {}
    out: dict[int, str] = {}
    # the words of repeated lines (a crash loop) looked up once: (self, family words)
    said: dict[str, tuple[str | None, str | None]] = {}
    for h in kept:
        r = h.rule
        if r.kind not in ("failure", "consequence") or r.category not in policy.category_context:
            continue
        if r.id in policy.fixed_rules:
            continue
        ln = h.line
        own_words = said.get(ln.body)
        if own_words is None:
            own_words = said[ln.body] = (
                policy.self_category(ln.body),
                policy.words_category(ln.body),
            )
        got = own_words[0]
        if got is None and ln.tb_chain is not None:
            own = [e for e in index.by_chain.get(ln.tb_chain, []) if e.index <= ln.tb_index]
            if own:
                first_index = min(e.index for e in own)
                got = [e for e in own if e.index == first_index][-1].stage
        if got is None:
            got = own_words[1]
        if got is None:
            no = ln.line_no
            near = [
                e
                for e in index.around(no - policy.window_before, no + policy.window_after)
                if not e.frame
            ]
            if near:
                got = min(near, key=lambda e: (abs(e.line_no - no), e.line_no)).stage
        if got is None and r.fallback and word_category is not None:
            got = word_category(ln.body)
        if got is None and r.fallback:
            got = _component_category(ln, policy)
        if got is None and r.fallback and (stage_of or {}).get(ln.line_no, r.stage) != "serving":
            got = policy.exception_category(ln.body)
        if got is not None and got != r.category:
            out[ln.line_no] = got
    return out


# CANN's log prefix names the module that printed the line: `[ERROR] HCCL(36035,proc):…`
_CANN_MODULE_RE = re.compile(r"^\[[A-Z]+\] ([A-Z][A-Z_]+)\(\d")


def _component_category(ln: LogLine, policy: StageHints) -> str | None:
    """The family words of the component that printed a line, last: its source file
    (`[pynccl.py:113]`, a glog `ProcessGroupNCCL.cpp:1484`) or CANN's module (`HCCL(…)`). Only
    these envelope fields: a wrapper's names (a compose service `vllm-nccl-1 |`, a pod) say
    nothing about the failure."""
    parts = [ln.source_file or ""]
    m = _CANN_MODULE_RE.match(ln.text)
    if m:
        parts.append(m.group(1))
    joined = " ".join(p for p in parts if p)
    if not joined:
        return None
    return policy.self_category(joined) or policy.words_category(joined)


def _notice(h: Classified) -> bool:
    """A warning that reports load, not a fault: KV-cache preemption (KV007)."""
    return h.rule.severity not in _SERIOUS and h.rule.category == "kv_cache"


def _outranks(h: Classified, roots: list[Classified]) -> bool:
    """A fallback with stronger evidence than every earlier root, all of them fallbacks (an
    uncaught exception after a bare exit status): it stays a root, to be ranked."""
    return all(r.rule.fallback for r in roots) and h.rule.evidence < min(
        r.rule.evidence for r in roots
    )


#: fallback evidence of a process's end (a fatal signal 3, an exit status 4): a failure known
#: only by it yields to an earlier line that reports a failure (see _first_failure)
_END_EVIDENCE = 3
#: identical copies of an unknown error line, from its process, that mark it as survived
_SURVIVED_REPEATS = 5


def _survived_fallback(roots: list[Classified], live: list[Classified]) -> Classified | None:
    """A later fatal failure a rule states, when the first root is an error no rule knew that
    its process kept logging, word for word, again and again (a client's retried
    `[Errno 111] Connection refused` while a training job runs on): the process lived through
    it, and the fatal failure in another process is what ended the run. ``None`` otherwise."""
    first = roots[0]
    if not first.rule.fallback:
        return None
    later = next(
        (
            h
            for h in roots[1:]
            if not h.rule.fallback
            and h.rule.severity == "fatal"
            and h.line.process != first.line.process
        ),
        None,
    )
    if later is None:
        return None
    body, process, until = first.line.body, first.line.process, later.line.line_no
    repeats = sum(
        1
        for h in live
        if h.line.line_no < until and h.line.body == body and h.line.process == process
    )
    return later if repeats > _SURVIVED_REPEATS else None


def _best_root(roots: list[Classified]) -> Classified:
    """The first causal failure among the serious roots: the earliest, unless every root is a
    fallback (an error no rule knew); then the strongest evidence wins (an uncaught exception
    over a bare ERROR line over a fatal signal over an exit status), earliest among equals."""
    if not all(h.rule.fallback for h in roots):
        return roots[0]
    best = min(h.rule.evidence for h in roots)
    return next(h for h in roots if h.rule.evidence == best)


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
    * A fallback exception (or the last resort's error-level line) takes the stage in progress.
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
        if hinted == UNREADY:
            # No serving failure, whatever its code or its rule's usual stage: a rule that
            # usually strikes while serving takes the stage in progress (else the engine's
            # start-up); any other is judged as if no hint were there.
            if r.stage == "serving":
                return stage_in_progress(no, evidence, default="engine_init")
            hinted = None
        if hinted is not None:
            return hinted
    if (r.fallback and r.scope != "line") or not r.stage:
        return stage_in_progress(no, evidence, default=pol.exception_stage(h.line.body) or r.stage)
    seen = [s for s, ev in evidence.items() if ev.first_line < no]
    if not seen:
        # A wrapper that stands in for an exception the log does not show (Ray's
        # `RayTaskError(ModuleNotFoundError)`) names its class: the class's stage hint.
        return pol.exception_stage(h.line.body) if r.kind == "consequence" else None
    cur = max(seen, key=lambda s: _T[s])
    ev = evidence[cur]
    unfinished = ev.completed_at is None or ev.completed_at > no
    if (
        r.category in _ANY_STAGE
        and r.id not in pol.fixed_rules
        and cur in completable
        and unfinished
        and _T[cur] < _T[r.stage]
    ):
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

    __slots__ = ("by_chain", "events", "lines", "unready")

    def __init__(self, hints: Sequence[HintEvent]) -> None:
        self.events = sorted(hints, key=lambda e: e.line_no)
        self.lines = [e.line_no for e in self.events]
        self.unready = [e.line_no for e in self.events if e.stage == UNREADY]
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
    start = [e for e in own if e.stage not in _NOT_START]
    if start:
        # Innermost: the first traceback of the chain, its last hinted frame.
        first_index = min(e.index for e in start)
        return [e for e in start if e.index == first_index][-1].stage
    start = [e for e in near if e.stage not in _NOT_START]
    if start:
        # Nearest (the failing traceback's frames follow or precede the line).
        return min(start, key=lambda e: (abs(e.line_no - no), e.line_no)).stage
    if _unready_around(index.unready, no, policy.window_after):
        return UNREADY
    if any(e.stage == "serving" for e in own) or any(e.stage == "serving" for e in near):
        return "serving"
    return None


_NOT_START = frozenset(("serving", UNREADY))


def _unready_around(unready: list[int], no: int, window_after: int) -> bool:
    """The engine says it never finished starting: anywhere before line ``no`` (vLLM logs
    `EngineCore failed to start.` above the traceback it explains; a server that answered
    later has made the failure a serving one before any hint is asked), or within
    ``window_after`` lines after it (`WorkerProc initialization failed` below a worker's)."""
    if not unready or unready[0] > no + window_after:
        return False
    if unready[0] < no:
        return True
    at = bisect.bisect_right(unready, no)
    return at < len(unready) and unready[at] <= no + window_after


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
