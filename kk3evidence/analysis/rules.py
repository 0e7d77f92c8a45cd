"""Rules as data: load ``rules/*.toml``, validate them, compile their patterns once.

A rule file holds ``[[rule]]`` tables (format: ``docs/rules-format.md``, schema:
``schemas/rule.schema.json``). :func:`load_rules` returns the shipped :class:`RuleSet`
(cached); :func:`load_rule_files` loads any other files (tests, ``--rules``).

``kk3evidence rules doc`` prints ``docs/rules.md`` (generated); ``kk3evidence rules check``
validates every rule file strictly.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kk3evidence import _resources
from kk3evidence.analysis.grammar import (
    MAX_MATCH_CHARS,
    CompiledPattern,
    LogLine,
    compile_pattern,
    is_interleaved_frames,
    is_tb_header,
    normalize_level,
    parse_line,
)
from kk3evidence.bundle.schema import load_toml
from kk3evidence.errors import RuleError
from kk3evidence.model import (
    CATEGORIES,
    FORMAT_IDS,
    RULE_STATUSES,
    SEVERITIES,
    STAGES,
    JSONObject,
)

__all__ = [
    "KINDS",
    "Rule",
    "RuleSet",
    "StageHints",
    "check_rules",
    "iter_rule_problems",
    "load_rule_files",
    "load_rules",
    "load_stage_hints",
    "raised_class",
    "render_rules_doc",
]

KINDS: tuple[str, ...] = ("failure", "milestone", "consequence", "noise")
_ID_RE = re.compile(r"^[A-Z][A-Z0-9]{1,9}\d{3}$")
_NAME_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
# Scopes whose rules see lines chosen by the engine, not by anchors.
_ANCHORLESS_SCOPES = ("exception", "level", "cut", "interleaved")
_MIN_ANCHOR = 4


@dataclass(frozen=True, slots=True)
class Rule:
    """One compiled rule. ``matches(line)`` returns the captures dict or ``None``."""

    id: str
    name: str
    kind: str
    stage: str | None
    category: str | None
    severity: str
    status: str
    summary: str
    why: str
    next_steps: tuple[str, ...]
    anchors: tuple[str, ...]
    pattern_sources: tuple[str, ...]
    levels: frozenset[str] | None
    match: tuple[str, ...]
    no_match: tuple[str, ...]
    consequence_of: frozenset[str] | None
    # noise: "shutdown" = only after a requested shutdown; failure or consequence: "unready" =
    # only in a log that never reaches ready (a retry that may still succeed, a notice that a
    # healthy run prints too), "cuda_platform" = only while no out-of-tree platform plugin
    # (Ascend, Kunlun, Metal, …) is active (a CUDA library it does not use may be missing),
    # "device_cause" = "unready", and it yields to a later failure that does not concern the
    # device (a process that sees no GPU matters only when something needed one)
    when: str | None = None
    # milestone: "complete" (stage done), "ready" (the server answers: complete + serving starts
    # at the next failure), "shutdown" (a stop was requested), "foreign_platform" (an
    # out-of-tree platform plugin was activated)
    marks: str | None = None
    # "line" | "exception" (only traceback exception/detail lines) | "level" (the last resort:
    # an error-level line, only when the log states no other failure; analysis.lastresort) |
    # "cut" (the last resort too: the header of a traceback the log ends in) | "interleaved"
    # (the last resort too: frame text of several stack dumps mixed within one line)
    scope: str = "line"
    fallback: bool = False  # only when no other rule claims the line
    priority: int = 0
    since: str = "0.1.0"  # the kk3evidence version that added the rule
    references: tuple[str, ...] = ()  # where its example lines and facts come from
    evidence: int = 1  # fallbacks: how strong the evidence is (1 strongest; causality ranks)
    # only lines whose envelope names a source location (NCCL's `ras/client_support.cc:160`,
    # glog's file) containing one of these substrings
    sources: tuple[str, ...] | None = None
    source: str = ""
    order: int = 0
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def simple(self) -> bool:
        """A milestone decided by its anchors alone (no pattern or level; at most a
        ``complete`` mark): the fast path only needs its first and last line per block."""
        return (
            self.kind == "milestone"
            and not self.pattern_sources
            and self.levels is None
            and self.marks in (None, "complete", "ready")
            and self.scope == "line"
        )

    @property
    def patterns(self) -> tuple[CompiledPattern, ...]:
        """The compiled patterns (compiled on first use, shared across rules)."""
        return tuple(_compiled(p) for p in self.pattern_sources)

    def matches(self, line: LogLine) -> dict[str, str] | None:
        if self.scope == "exception" and line.tb_role not in ("exception", "detail"):
            return None
        if self.scope == "level" and (line.level is None or line.level not in (self.levels or ())):
            return None
        if self.scope == "cut":
            return {} if is_tb_header(line.body.strip()) else None
        if self.scope == "interleaved":
            return {} if is_interleaved_frames(line.body) else None
        if line.tb_role in ("frame", "header", "separator"):
            return None
        if self.levels is not None and line.level is not None and line.level not in self.levels:
            return None
        if self.sources is not None and not _from_source(line.source_file, self.sources):
            return None
        body = line.body
        if len(body) > MAX_MATCH_CHARS:
            body = body[:MAX_MATCH_CHARS]
        if self.anchors and not any(a in body for a in self.anchors):
            return None
        if not self.pattern_sources:
            return {}
        for pat in self.patterns:
            caps = pat.search(body)
            if caps is not None:
                return caps
        return None

    def matches_text(self, text: str, *, exception_line: bool = False) -> dict[str, str] | None:
        """Match one raw line on its own (envelope parsed, no traceback context)."""
        line = parse_line(1, text)
        if exception_line:
            line = _as_exception(line)
        return self.matches(line)

    def to_json(self) -> JSONObject:
        return {
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "stage": self.stage,
            "category": self.category,
            "severity": self.severity,
            "status": self.status,
            "summary": self.summary,
            "why": self.why,
            "next_steps": list(self.next_steps),
            "anchors": list(self.anchors),
            "pattern": list(self.pattern_sources),
            "levels": [*sorted(self.levels)] if self.levels is not None else None,
            "match": list(self.match),
            "no_match": list(self.no_match),
            "consequence_of": [*sorted(self.consequence_of)] if self.consequence_of else None,
            "when": self.when,
            "marks": self.marks,
            "scope": self.scope,
            "fallback": self.fallback,
            "priority": self.priority,
            "since": self.since,
            "references": list(self.references),
            "evidence": self.evidence,
            "source": self.source,
        }


@functools.lru_cache(maxsize=8192)
def _from_source(where: str | None, sources: tuple[str, ...]) -> bool:
    return where is not None and any(x in where for x in sources)


def _compiled(source: str) -> CompiledPattern:
    return compile_pattern(source)


def _as_exception(line: LogLine) -> LogLine:
    from dataclasses import replace

    return replace(line, tb_role="exception", tb_chain=0, tb_index=0)


# Precedence when several rules claim one line: noise, consequence, failure, milestone;
# then higher priority; fallback rules last; then file order.
_KIND_RANK = {"noise": 0, "consequence": 1, "failure": 2, "milestone": 3}


@dataclass(frozen=True, slots=True)
class RuleSet:
    rules: tuple[Rule, ...]
    by_id: dict[str, Rule]
    anchors: tuple[str, ...]  # every distinct anchor, index = anchor id
    anchor_rules: tuple[tuple[Rule, ...], ...]  # anchor id -> rules (in precedence order)
    anchorless: tuple[Rule, ...]  # exception-scope rules without anchors
    # anchor id -> the category every specific failure rule using that anchor has, or None:
    # the rule set's own words, for a failure no rule's grammar matched (see word_category)
    anchor_categories: tuple[str | None, ...] = ()

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def get(self, rule_id: str) -> Rule | None:
        return self.by_id.get(rule_id)

    def without(self, *rule_ids: str) -> RuleSet:
        """This rule set less ``rule_ids``: how the analyzer answers a log whose rule does not
        exist yet (``scripts/score-ablation``)."""
        drop = set(rule_ids)
        return _build([r for r in self.rules if r.id not in drop])


def _precedence(rule: Rule) -> tuple[int, int, int, int]:
    return (int(rule.fallback), _KIND_RANK[rule.kind], -rule.priority, rule.order)


def _build(rules: list[Rule]) -> RuleSet:
    seen: dict[str, Rule] = {}
    for r in rules:
        if r.id in seen:
            raise RuleError(
                f"{r.source}: rule id {r.id} is also used in {seen[r.id].source}; ids must be "
                "unique and are never reused"
            )
        seen[r.id] = r
    ordered = sorted(rules, key=_precedence)
    anchor_ids: dict[str, int] = {}
    per_anchor: list[list[Rule]] = []
    anchorless: list[Rule] = []
    for r in ordered:
        if not r.anchors and r.scope == "exception":
            anchorless.append(r)
        for a in r.anchors:
            if a not in anchor_ids:
                anchor_ids[a] = len(per_anchor)
                per_anchor.append([])
            per_anchor[anchor_ids[a]].append(r)
    return RuleSet(
        rules=tuple(ordered),
        by_id=dict(seen),
        anchors=tuple(anchor_ids),
        anchor_rules=tuple(tuple(x) for x in per_anchor),
        anchorless=tuple(anchorless),
        anchor_categories=tuple(
            _anchor_category(a, rs) for a, rs in zip(anchor_ids, per_anchor, strict=True)
        ),
    )


# Anchors shorter than this say too little on their own to decide a category ("OOM", "HCCL").
_MIN_WORD = 5


def _anchor_category(anchor: str, rules: list[Rule]) -> str | None:
    """The category an anchor stands for: the one category of every specific (non-fallback)
    failure rule that uses it, when that is not ``other``; ``None`` for anchors shared by
    categories, used only by milestones, noise, consequences or fallbacks, or too short."""
    if len(anchor) < _MIN_WORD:
        return None
    cats = {r.category for r in rules if r.kind == "failure" and not r.fallback}
    if len(cats) != 1:
        return None
    (cat,) = cats
    return cat if cat != "other" else None


def _as_list(v: Any) -> list[Any]:
    if v is None:
        return []
    if isinstance(v, list):
        return v
    return [v]


def _schema() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(_resources.read_text("schemas", "rule.schema.json"))
    return data


def iter_rule_problems(
    doc: Mapping[str, object], source: str, *, strict: bool = True
) -> Iterator[str]:
    """Yield one located message per problem in a parsed rule file.

    ``strict`` (the default; tests, ``--check``, user rule files) validates against
    ``schemas/rule.schema.json`` and compiles every pattern. The shipped rules are loaded
    non-strict at run time (the test suite has validated them): only the cheap semantic checks
    run, and each pattern is compiled once, by the loader.
    """
    if strict:
        import jsonschema  # type: ignore[import-untyped]

        validator = jsonschema.Draft202012Validator(_schema())
        for err in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
            path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
            yield f"{source}: ${path}: {err.message}"
    elif not isinstance(doc.get("rule"), list):
        yield f"{source}: no [[rule]] tables"
    tables = doc.get("rule", [])
    for i, r in enumerate(tables if isinstance(tables, list) else []):
        if not isinstance(r, dict):
            continue
        where = f"{source}: rule[{i}] {r.get('id', '?')}"
        kind = r.get("kind")
        if kind in ("failure", "consequence") and not r.get("category"):
            yield f"{where}: a {kind} rule needs a category (one of {', '.join(CATEGORIES)})"
        if kind in ("failure", "consequence", "milestone") and not r.get("stage"):
            yield f"{where}: a {kind} rule needs a stage (one of {', '.join(STAGES)})"
        if not r.get("anchors") and r.get("scope") not in _ANCHORLESS_SCOPES:
            yield f"{where}: give at least one literal anchor (the fast pre-filter needs it)"
        for a in _as_list(r.get("anchors")):
            if isinstance(a, str) and len(a) < _MIN_ANCHOR:
                yield f"{where}: anchor {a!r} is shorter than {_MIN_ANCHOR} characters"
            if isinstance(a, str) and ("\n" in a or "\r" in a):
                yield f"{where}: anchor {a!r} spans lines; anchors are single-line literals"
        if r.get("consequence_of") and kind != "consequence":
            yield f"{where}: consequence_of is only for kind = 'consequence'"
        if r.get("when") == "shutdown" and kind != "noise":
            yield f"{where}: when = 'shutdown' is only for kind = 'noise'"
        if r.get("when") in ("unready", "cuda_platform", "device_cause") and kind not in (
            "failure",
            "consequence",
        ):
            yield f"{where}: when = {r.get('when')!r} is only for kind = 'failure' or 'consequence'"
        if r.get("marks") == "message_tail":
            if kind != "consequence":
                yield f"{where}: marks = 'message_tail' is only for kind = 'consequence'"
        elif r.get("marks") and kind != "milestone":
            yield f"{where}: marks is only for kind = 'milestone'"
        if not _as_list(r.get("match")):
            yield f"{where}: give at least one match example"
        for field_name in ("id", "name", "kind", "summary"):
            if not isinstance(r.get(field_name), str):
                yield f"{where}: {field_name} is missing or not a string"
        if kind not in KINDS:
            yield f"{where}: kind must be one of {', '.join(KINDS)}"
        if r.get("stage") is not None and r.get("stage") not in STAGES:
            yield f"{where}: unknown stage {r.get('stage')!r}"
        if r.get("category") is not None and r.get("category") not in CATEGORIES:
            yield f"{where}: unknown category {r.get('category')!r}"
        if r.get("severity") is not None and r.get("severity") not in SEVERITIES:
            yield f"{where}: unknown severity {r.get('severity')!r}"
        if r.get("status") not in RULE_STATUSES:
            yield f"{where}: status must be one of {', '.join(RULE_STATUSES)}"
        if not strict:
            continue
        for pat in _as_list(r.get("pattern")):
            if not isinstance(pat, str):
                continue
            try:
                compile_pattern(pat)
            except RuleError as err:
                yield f"{where}: {err}"


def _compile_rule(r: dict[str, Any], source: str, order: int) -> Rule:
    patterns = tuple(str(p) for p in _as_list(r.get("pattern")))
    levels = r.get("levels")
    lv = frozenset(normalize_level(x) or x for x in levels) if levels else None
    cons = r.get("consequence_of")
    return Rule(
        id=r["id"],
        name=r["name"],
        kind=r["kind"],
        stage=r.get("stage"),
        category=r.get("category"),
        severity=r.get("severity", "info" if r["kind"] in ("milestone", "noise") else "error"),
        status=r["status"],
        summary=r.get("summary", ""),
        why=r.get("why", ""),
        next_steps=tuple(r.get("next_steps", [])),
        anchors=tuple(r.get("anchors", [])),
        pattern_sources=patterns,
        levels=lv,
        match=tuple(_as_list(r.get("match"))),
        no_match=tuple(_as_list(r.get("no_match"))),
        consequence_of=frozenset(cons) if cons else None,
        when=r.get("when"),
        marks=r.get("marks"),
        scope=r.get("scope", "line"),
        fallback=bool(r.get("fallback", False)),
        priority=int(r.get("priority", 0)),
        since=str(r.get("since", "0.1.0")),
        references=tuple(r.get("references", [])),
        evidence=int(r.get("evidence", 1)),
        sources=tuple(str(x) for x in r["sources"]) if r.get("sources") else None,
        source=source,
        order=order,
        raw=dict(r),
    )


def _load_docs(docs: Iterable[tuple[str, str]], *, strict: bool = True) -> RuleSet:
    rules: list[Rule] = []
    problems: list[str] = []
    for source, text in docs:
        doc: dict[str, Any] = load_toml(text, source, error=RuleError)
        file_problems = list(iter_rule_problems(doc, source, strict=strict))
        if file_problems:
            problems.extend(file_problems)
            continue
        for r in doc.get("rule", []):
            try:
                rules.append(_compile_rule(r, source, len(rules)))
            except (KeyError, TypeError, ValueError) as err:
                raise RuleError(
                    f"{source}: rule {r.get('id', '?')}: malformed ({err}); run "
                    "'kk3evidence rules check' for every problem"
                ) from None
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise RuleError(problems[0] + more)
    return _build(rules)


def load_rule_files(
    paths: Sequence[str | Path], *, strict: bool = True, with_shipped: bool = False
) -> RuleSet:
    """Load rule files (or every rule file ``*.toml`` in given folders), validated strictly.
    ``with_shipped`` adds them to the shipped rules (ids must stay unique)."""
    docs: list[tuple[str, str]] = []
    for p in paths:
        path = Path(p)
        files = sorted(path.glob("*.toml")) if path.is_dir() else [path]
        for f in files:
            try:
                text = f.read_text(encoding="utf-8")
            except OSError as err:
                raise RuleError(f"{f}: cannot read rule file ({err.strerror})") from None
            if path.is_dir() and not _is_rule_doc(text):
                continue
            docs.append((f.name if path.is_dir() else str(f), text))
    if with_shipped:
        shipped = load_rules()
        extra = _load_docs(docs, strict=strict)
        return _build([*shipped.rules, *extra.rules])
    return _load_docs(docs, strict=strict)


RULES_SCHEMA = FORMAT_IDS["rules"]


def _is_rule_doc(text: str) -> bool:
    """Other data files may live in ``rules/`` (they declare their own ``schema``)."""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("schema") and "=" in line:
            return RULES_SCHEMA in line
        if line.startswith("[[rule]]"):
            return True
    return "[[rule]]" in text


def _shipped_docs() -> list[tuple[str, str]]:
    docs: list[tuple[str, str]] = []
    for node in sorted(_resources.data_dir("rules").iterdir(), key=lambda t: t.name):
        if node.is_file() and node.name.endswith(".toml"):
            text = node.read_text(encoding="utf-8")
            if _is_rule_doc(text):
                docs.append((node.name, text))
    return docs


@functools.lru_cache(maxsize=1)
def load_rules() -> RuleSet:
    """The rules shipped with kk3evidence (top-level ``rules/*.toml`` rule files), compiled
    once and cached. (The test suite and ``--check`` validate them against the schema.)"""
    return _load_docs(_shipped_docs(), strict=False)


def check_rules() -> RuleSet:
    """The shipped rules, validated strictly (schema, every pattern)."""
    return _load_docs(_shipped_docs(), strict=True)


# --------------------------------------------------------------------------------------------
# rules/stage-hints.toml
# --------------------------------------------------------------------------------------------

STAGE_HINTS_SCHEMA = FORMAT_IDS["stage-hints"]
_HINT_KEYS = frozenset({"stage", "frame", "line", "exception"})
_EXC_NAME_RE = re.compile(r"[A-Z][A-Za-z0-9_]*(?:Error|Exception)")
# the first exception class a line names as raised: `ValueError: …`, `ValueError(…)`, a bare
# `ValueError` ending the line; `pkg.mod.ValueError` counts as ValueError
_RAISED_RE = re.compile(
    r"(?<![\w])(?:[A-Za-z_][\w]*\.)*([A-Z][A-Za-z0-9_]*(?:Error|Exception))(?=:|\(|\s*$)"
)
_WRAPPED_RE = re.compile(r"RayTaskError\((\w+)\)")
_CAT_HINT_KEYS = frozenset({"category", "frame", "line", "self", "words", "exception"})
_HINTS_TOP = frozenset(
    {
        "schema",
        "context_categories",
        "fixed_rules",
        "window_before",
        "window_after",
        "hint",
        "category_context",
        "category_hint",
    }
)


def raised_class(body: str) -> str | None:
    """The first exception class ``body`` names as raised (:data:`_RAISED_RE`), without its
    module path: ``KeyError`` of ``KeyError: 'x'`` or ``ray.exceptions.ActorDiedError: …``."""
    m = _RAISED_RE.search(body)
    return m.group(1) if m else None


def _raised_lookup(pairs: tuple[tuple[str, str], ...], body: str) -> str | None:
    """The value paired with the exception class ``body`` raises (:data:`_RAISED_RE`)."""
    name = raised_class(body) if pairs else None
    if name is None:
        return None
    if name == "RayTaskError":  # Ray's wrapper names the remote class: RayTaskError(KeyError)
        inner = _WRAPPED_RE.search(body)
        name = inner.group(1) if inner else name
    return next((value for n, value in pairs if n == name), None)


def _split_frame_hints(
    frame: tuple[tuple[str, str], ...],
) -> tuple[dict[str, str], tuple[tuple[str, str], ...]]:
    """``in <name>`` hints (exact function names) apart from substring hints."""
    funcs: dict[str, str] = {}
    subs: list[tuple[str, str]] = []
    for needle, value in frame:
        if needle.startswith("in ") and " " not in needle[3:]:
            funcs.setdefault(needle[3:], value)
        else:
            subs.append((needle, value))
    return funcs, tuple(subs)


def _frame_lookup(
    body: str, funcs: dict[str, str], subs: tuple[tuple[str, str], ...]
) -> str | None:
    at = body.rfind(", in ")
    if at >= 0:
        name = body[at + 5 :].strip()
        if name.endswith(")"):  # IPython: `…, in LLM.__init__(self, model, …)`
            name = name.split("(", 1)[0].rsplit(".", 1)[-1]
        got = funcs.get(name)
        if got is not None:
            return got
    for needle, value in subs:
        if needle in body:
            return value
    return None


@dataclass(frozen=True, slots=True)
class StageHints:
    """Where a context-dependent failure happened: see ``rules/stage-hints.toml``."""

    context_categories: frozenset[str] = frozenset()
    fixed_rules: frozenset[str] = frozenset()
    window_before: int = 0
    window_after: int = 0
    frame: tuple[tuple[str, str], ...] = ()  # (substring of a frame line, stage)
    line: tuple[tuple[str, str], ...] = ()  # (substring of a nearby line, stage)
    # (exception class, stage): where a fallback exception belongs when no stage is in
    # progress at its line (an ImportError before any milestone: a broken install)
    exception: tuple[tuple[str, str], ...] = ()
    # Category from context: failures of these categories take the category their own text,
    # their traceback's frames or nearby lines point at ([[category_hint]] tables).
    category_context: frozenset[str] = frozenset()
    cat_frame: tuple[tuple[str, str], ...] = ()  # (substring of a frame line, category)
    cat_line: tuple[tuple[str, str], ...] = ()  # (substring of a nearby line, category)
    cat_self: tuple[tuple[str, str], ...] = ()  # (substring of the failure line, category)
    # family words: substrings of the failure line, looked at after its traceback's frames
    cat_words: tuple[tuple[str, str], ...] = ()
    # exception class name -> category: a fallback's last resort (the class of the exception
    # its line raises, when nothing else in or around it names a family)
    cat_exception: tuple[tuple[str, str], ...] = ()
    # Derived from ``frame``: function names (``in <name>`` hints) and the other substrings.
    frame_funcs: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    frame_subs: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)
    cat_funcs: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    cat_subs: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.frame and not self.frame_funcs and not self.frame_subs:
            funcs, subs = _split_frame_hints(self.frame)
            self.frame_funcs.update(funcs)
            object.__setattr__(self, "frame_subs", subs)
        if self.cat_frame and not self.cat_funcs and not self.cat_subs:
            funcs, subs = _split_frame_hints(self.cat_frame)
            self.cat_funcs.update(funcs)
            object.__setattr__(self, "cat_subs", subs)

    def frame_stage(self, body: str) -> str | None:
        """The stage hinted by a traceback frame line: ``in <name>`` hints match the frame's
        function name exactly (and win), other hints are substrings of the line."""
        return _frame_lookup(body, self.frame_funcs, self.frame_subs)

    def line_stage(self, body: str, only: AbstractSet[str] | None = None) -> str | None:
        """The stage of the first line hint in ``body`` (``only``: the needles the prefilter
        found in the line; the others are not searched for, a saving on long lines)."""
        for needle, stage in self.line:
            if (only is None or needle in only) and needle in body:
                return stage
        return None

    def frame_category(self, body: str) -> str | None:
        """The category hinted by a traceback frame line (same matching as :meth:`frame_stage`)."""
        return _frame_lookup(body, self.cat_funcs, self.cat_subs)

    def line_category(self, body: str, only: AbstractSet[str] | None = None) -> str | None:
        for needle, cat in self.cat_line:
            if (only is None or needle in only) and needle in body:
                return cat
        return None

    def self_category(self, body: str) -> str | None:
        return _first_needle(self.cat_self, body)

    def exception_stage(self, body: str) -> str | None:
        """The stage the class of the exception a line raises points at (``exception`` in a
        ``[[hint]]``), or None."""
        return _raised_lookup(self.exception, body)

    def exception_category(self, body: str) -> str | None:
        """The category of the exception class a line raises (its first ``Name:`` /
        ``Name(`` / bare ``Name`` token that ends in Error or Exception; a dotted module path
        before it is ignored), from the ``exception`` hints."""
        return _raised_lookup(self.cat_exception, body)

    def words_category(self, body: str) -> str | None:
        """The category of the first family word (``words``) in ``body``."""
        return _first_needle(self.cat_words, body)

    @property
    def line_needles(self) -> tuple[str, ...]:
        """Every line-hint needle (stage and category): prefilter anchors."""
        seen = dict.fromkeys(n for n, _ in self.line)
        seen.update(dict.fromkeys(n for n, _ in self.cat_line))
        return tuple(seen)


def _first_needle(pairs: tuple[tuple[str, str], ...], body: str) -> str | None:
    """The category of the first (needle, category) pair whose needle is in ``body``."""
    for needle, cat in pairs:
        if needle in body:
            return cat
    return None


def _str_list(v: Any, what: str, source: str) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise RuleError(f"{source}: {what} must be a list of non-empty strings")
    return list(v)


def parse_stage_hints(text: str, source: str = "rules/stage-hints.toml") -> StageHints:
    """Validate and build :class:`StageHints` from the TOML text (one-line RuleError)."""
    doc: dict[str, Any] = load_toml(text, source, error=RuleError)
    if doc.get("schema") != STAGE_HINTS_SCHEMA:
        raise RuleError(f"{source}: schema must be {STAGE_HINTS_SCHEMA!r}")
    unknown = sorted(set(doc) - _HINTS_TOP)
    if unknown:
        raise RuleError(f"{source}: unknown key {unknown[0]!r}")
    cats = _str_list(doc.get("context_categories", []), "context_categories", source)
    bad = [c for c in cats if c not in CATEGORIES]
    if bad:
        raise RuleError(f"{source}: unknown category {bad[0]!r} in context_categories")
    fixed = _str_list(doc.get("fixed_rules", []), "fixed_rules", source)
    windows: list[int] = []
    for key in ("window_before", "window_after"):
        v = doc.get(key, 0)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 500:
            raise RuleError(f"{source}: {key} must be an integer from 0 to 500")
        windows.append(v)
    frame: list[tuple[str, str]] = []
    line: list[tuple[str, str]] = []
    exception: list[tuple[str, str]] = []
    hints = doc.get("hint", [])
    if not isinstance(hints, list):
        raise RuleError(f"{source}: hint must be an array of tables ([[hint]])")
    for i, h in enumerate(hints):
        where = f"hint #{i + 1}"
        if not isinstance(h, dict):
            raise RuleError(f"{source}: {where} must be a table")
        extra = sorted(set(h) - _HINT_KEYS)
        if extra:
            raise RuleError(f"{source}: {where}: unknown key {extra[0]!r}")
        stage = h.get("stage")
        if stage not in STAGES and stage != UNREADY:
            raise RuleError(
                f"{source}: {where}: stage {stage!r} is not one of {[*STAGES, UNREADY]}"
            )
        if stage == UNREADY and (h.get("frame") or h.get("exception")):
            raise RuleError(f"{source}: {where}: an {UNREADY!r} hint takes lines only")
        frame += [(x, stage) for x in _str_list(h.get("frame", []), f"{where}: frame", source)]
        line += [(x, stage) for x in _str_list(h.get("line", []), f"{where}: line", source)]
        for x in _str_list(h.get("exception", []), f"{where}: exception", source):
            if not _EXC_NAME_RE.fullmatch(x):
                raise RuleError(f"{source}: {where}: {x!r} is not a Python exception class name")
            exception.append((x, stage))
    cat_ctx = _str_list(doc.get("category_context", []), "category_context", source)
    bad = [c for c in cat_ctx if c not in CATEGORIES]
    if bad:
        raise RuleError(f"{source}: unknown category {bad[0]!r} in category_context")
    cframe, cline, cself, cwords, cexc = _category_hints(doc.get("category_hint", []), source)
    return StageHints(
        context_categories=frozenset(cats),
        fixed_rules=frozenset(fixed),
        window_before=windows[0],
        window_after=windows[1],
        frame=tuple(frame),
        line=tuple(line),
        exception=tuple(exception),
        category_context=frozenset(cat_ctx),
        cat_frame=cframe,
        cat_line=cline,
        cat_self=cself,
        cat_words=cwords,
        cat_exception=cexc,
    )


_Pairs = tuple[tuple[str, str], ...]

#: A ``[[hint]]`` "stage" that is none: its lines say the engine never finished starting
#: (``EngineCore failed to start``), so a failure just before one is no serving failure.
UNREADY = "unready"
#: A failure rule's ``when``: a process that sees no GPU; it yields to a later failure that
#: does not concern the device (analysis/causality.py).
DEVICE_CAUSE = "device_cause"


def _category_hints(
    hints: Any, source: str
) -> tuple[_Pairs, _Pairs, _Pairs, _Pairs, _Pairs]:
    """``[[category_hint]]`` tables -> (frame, line, self, words, exception) (needle, category)
    pairs."""
    if not isinstance(hints, list):
        raise RuleError(f"{source}: category_hint must be an array of tables ([[category_hint]])")
    out: dict[str, list[tuple[str, str]]] = {
        "frame": [], "line": [], "self": [], "words": [], "exception": []
    }
    for i, h in enumerate(hints):
        where = f"category_hint #{i + 1}"
        if not isinstance(h, dict):
            raise RuleError(f"{source}: {where} must be a table")
        extra = sorted(set(h) - _CAT_HINT_KEYS)
        if extra:
            raise RuleError(f"{source}: {where}: unknown key {extra[0]!r}")
        cat = h.get("category")
        if cat not in CATEGORIES:
            raise RuleError(f"{source}: {where}: category {cat!r} is not one of {list(CATEGORIES)}")
        for key, pairs in out.items():
            pairs += [(x, cat) for x in _str_list(h.get(key, []), f"{where}: {key}", source)]
    bad = [x for x, _ in out["exception"] if not _EXC_NAME_RE.fullmatch(x)]
    if bad:
        raise RuleError(f"{source}: exception {bad[0]!r} is not a Python exception class name")
    return (
        tuple(out["frame"]),
        tuple(out["line"]),
        tuple(out["self"]),
        tuple(out["words"]),
        tuple(out["exception"]),
    )


@functools.lru_cache(maxsize=1)
def load_stage_hints() -> StageHints:
    """The shipped ``rules/stage-hints.toml`` (validated, cached)."""
    node = _resources.data_dir("rules").joinpath("stage-hints.toml")
    try:
        text = node.read_text(encoding="utf-8")
    except OSError:
        return StageHints()
    return parse_stage_hints(text)


# --------------------------------------------------------------------------------------------
# docs/rules.md
# --------------------------------------------------------------------------------------------

DOC_COMMAND = "kk3evidence rules doc > docs/rules.md"


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|")


def render_rules_doc(ruleset: RuleSet | None = None) -> str:
    """The generated ``docs/rules.md``: every rule, grouped by file, in id order."""
    rs = ruleset if ruleset is not None else load_rules()
    by_file: dict[str, list[Rule]] = {}
    for r in sorted(rs.rules, key=lambda r: (r.source, r.id)):
        by_file.setdefault(r.source, []).append(r)
    out: list[str] = [
        "# Rules",
        "",
        f"<!-- Generated from rules/*.toml by `{DOC_COMMAND}`. Do not edit by hand. -->",
        "",
        "Every rule is data in `rules/<family>.toml` (format: [rules-format.md](rules-format.md)).",
        "Failure rules state a failure; consequence rules only report an earlier one; milestones",
        "mark healthy progress through the stages; noise rules claim known harmless lines so they",
        "never count. `pytest -k <ID>` runs one rule's examples.",
        "",
        f"{len(rs.rules)} rules: "
        + ", ".join(f"{sum(1 for r in rs.rules if r.kind == k)} {k}" for k in KINDS)
        + ".",
        "",
        "| id | name | kind | stage | category | severity | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for rules in by_file.values():
        for r in rules:
            out.append(
                f"| [{r.id}](#{r.id.lower()}) | {r.name} | {r.kind} | {r.stage or ''} | "
                f"{r.category or ''} | {r.severity} | {r.status} |"
            )
    out.append("")
    for source, rules in by_file.items():
        out += [f"## {source}", ""]
        for r in rules:
            out += [f"### {r.id}", "", f"**{r.name}** — {_md_escape(r.summary)}", ""]
            facts = [f"kind `{r.kind}`"]
            if r.stage:
                facts.append(f"stage `{r.stage}`")
            if r.category:
                facts.append(f"category `{r.category}`")
            facts += [f"severity `{r.severity}`", f"status `{r.status}`", f"since `{r.since}`"]
            if r.levels:
                facts.append("levels " + ", ".join(f"`{x}`" for x in sorted(r.levels)))
            if r.when:
                facts.append(f"only when `{r.when}`")
            if r.marks:
                facts.append(f"marks `{r.marks}`")
            if r.scope != "line":
                facts.append(f"scope `{r.scope}`")
            if r.fallback:
                facts.append(f"fallback (evidence rank {r.evidence})")
            if r.consequence_of:
                facts.append(
                    "consequence of " + ", ".join(f"`{c}`" for c in sorted(r.consequence_of))
                )
            out += ["- " + "; ".join(facts), ""]
            if r.why:
                out += [f"**Why it matters.** {r.why}", ""]
            if r.next_steps:
                out += ["**Next steps.**", ""] + [f"1. {s}" for s in r.next_steps] + [""]
            if r.anchors:
                out += ["Anchors: " + ", ".join(f"`{a}`" for a in r.anchors), ""]
            for src in r.pattern_sources:
                out += [f"Pattern: `{src}`", ""]
            if r.match:
                out += ["Matches:", "", "```text", *r.match, "```", ""]
            if r.no_match:
                out += ["Does not match:", "", "```text", *r.no_match, "```", ""]
            if r.references:
                out += ["References: " + ", ".join(f"<{u}>" for u in r.references), ""]
    return "\n".join(out).rstrip("\n") + "\n"
