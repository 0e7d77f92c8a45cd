"""Vocabulary and the small frozen records shared by every module.

The stage and category strings are a contract (SPEC §2): other tools and our checks depend on
these exact values. Records are frozen, slotted dataclasses; ``to_json()`` gives the SPEC §4 shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

# Stages in the seed's diagnostic order (not a time order), plus serving.
STAGES: tuple[str, ...] = (
    "container_init",
    "device_discovery",
    "weights_access",
    "engine_init",
    "comm_group",
    "api_ready",
    "serving",
)

CATEGORIES: tuple[str, ...] = (
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
    "hang",
    "other",
)
#: how the first causal failure was found (SPEC §4, 0.2): a rule matched, an unrecognised error
#: was ranked by the evidence, or no line states a failure and progress stopped
BASES: tuple[str, ...] = ("rule", "fallback", "stall")

SEVERITIES: tuple[str, ...] = ("fatal", "error", "warning", "info")
RULE_STATUSES: tuple[str, ...] = ("experimental", "stable", "deprecated")

#: a JSON value as ``json.loads`` gives it (no NaN/Infinity in ours); recursive
JSONValue: TypeAlias = "str | int | float | bool | list[JSONValue] | dict[str, JSONValue] | None"
#: a JSON object (a bundle member such as ``launch.json``, a manifest entry)
JSONObject: TypeAlias = "dict[str, JSONValue]"


def json_object(value: JSONValue) -> JSONObject | None:
    """``value`` when it is a JSON object, else None (reading a member without trusting it)."""
    return value if isinstance(value, dict) else None


def json_objects(value: JSONValue) -> list[JSONObject]:
    """The objects in ``value`` when it is a JSON array; anything else is skipped."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def json_list(value: JSONValue) -> list[JSONValue]:
    """``value`` when it is a JSON array, else an empty list."""
    return value if isinstance(value, list) else []


def json_str(value: JSONValue) -> str | None:
    """``value`` when it is a JSON string, else None."""
    return value if isinstance(value, str) else None


def json_int(value: JSONValue) -> int | None:
    """``value`` when it is a JSON integer (not a boolean), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None

Stage = str
Category = str
StageStatus = Literal["completed", "failed", "started"]

# Every versioned document kk3evidence reads or writes, by kind: "kk3evidence/<kind>/v<MAJOR>".
# One table, so a reader and a writer can never disagree on an id (docs/bundle-format.md).
FORMAT_IDS: dict[str, str] = {
    kind: f"kk3evidence/{kind}/v1"
    for kind in (
        "analysis", "bundle", "staging", "manifest", "fingerprint", "launch", "notes",
        "request", "prefix-probe", "diff", "check", "compare", "compat-rules", "rules",
        "stage-hints", "flag-classes", "vllm-args", "ladder-plan", "ladder-state",
        "ladder-result",
    )
}

ANALYSIS_SCHEMA = FORMAT_IDS["analysis"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One classified log line.

    ``kind`` is ``"failure"`` for a line that states a failure, ``"milestone"`` for a healthy
    progress line, ``"consequence"`` for a line that only reports an earlier failure.
    """

    line_no: int
    rule: str
    stage: Stage
    category: Category | None
    kind: Literal["failure", "milestone", "consequence"]
    text: str
    process: str | None = None
    severity: str = "error"
    caused_by: int | None = None  # line_no of the failure this consequence reports
    basis: str = "rule"  # BASES: how a first causal failure was found
    #: the ranks/processes that printed this same line (one finding for N ranks), in log order
    ranks: tuple[str, ...] = ()
    #: line numbers of the other ranks' copies folded into this finding
    folded: tuple[int, ...] = ()

    def to_json(self) -> JSONObject:
        out: dict[str, Any] = {
            "line_no": self.line_no,
            "rule": self.rule,
            "stage": self.stage,
            "category": self.category,
            "kind": self.kind,
            "severity": self.severity,
            "text": self.text,
            "process": self.process,
            "caused_by": self.caused_by,
        }
        if self.ranks:
            out["ranks"] = list(self.ranks)
            out["folded_lines"] = list(self.folded)
        return out


@dataclass(frozen=True, slots=True)
class StageSpan:
    stage: Stage
    status: StageStatus
    first_line: int
    last_line: int
    #: 0.2, from per-line receive times (``logs/lines.tsv``): seconds after the first line when
    #: the stage started, and how long it lasted (until the next stage or the end)
    started_s: float | None = None
    seconds: float | None = None

    def to_json(self) -> JSONObject:
        out: dict[str, Any] = {
            "stage": self.stage,
            "status": self.status,
            "first_line": self.first_line,
            "last_line": self.last_line,
        }
        if self.seconds is not None or self.started_s is not None:
            out["started_s"] = self.started_s
            out["seconds"] = self.seconds
        return out


@dataclass(frozen=True, slots=True)
class RuleInfo:
    """What the rule behind the first causal failure says (rides on its ``findings`` entry)."""

    name: str
    summary: str
    why: str
    next_steps: tuple[str, ...]
    severity: str
    #: None for the stall verdict (no rule file behind it): then the JSON has no key
    status: str | None = None

    def to_json(self) -> JSONObject:
        out: JSONObject = {"name": self.name, "summary": self.summary, "why": self.why,
                           "next_steps": list(self.next_steps), "severity": self.severity}
        if self.status is not None:
            out["status"] = self.status
        return out


@dataclass(frozen=True, slots=True)
class ContextLine:
    line_no: int
    text: str


@dataclass(frozen=True, slots=True)
class FailureContext:
    """The log lines around the first causal failure (``analyze --context``)."""

    before: tuple[ContextLine, ...] = ()
    after: tuple[ContextLine, ...] = ()

    def to_json(self) -> JSONObject:
        return {"before": [[c.line_no, c.text] for c in self.before],
                "after": [[c.line_no, c.text] for c in self.after]}

    @classmethod
    def from_json(cls, data: object) -> FailureContext:
        """From ``{"before": [[n, text]...], "after": [...]}``; rows of another shape are
        skipped."""
        d = data if isinstance(data, dict) else {}

        def rows(v: object) -> tuple[ContextLine, ...]:
            return tuple(ContextLine(r[0], str(r[1]))
                         for r in (v if isinstance(v, list | tuple) else ())
                         if isinstance(r, list | tuple) and len(r) == 2 and isinstance(r[0], int))

        return cls(rows(d.get("before")), rows(d.get("after")))


@dataclass(frozen=True, slots=True)
class ServingStall:
    """A serving stall seen in vLLM's stats lines (``analysis/serving_stall.py``): the first
    run of consecutive zero-throughput lines of one engine with requests running — its first
    and last line, how many stats lines, the requests running at its start, the engine id
    (V1's ``Engine 000``; ``None`` for V0) and the first line's raw text.

    ``confirmed``: two lines or more, or ``silent_s`` (the log went on that long after the
    run's last line with no stats line of that engine: vLLM logs the zero lines after the
    first at DEBUG level, so at INFO a stuck engine prints one and falls silent). An
    unconfirmed run (one line at the end of the log) is a stall only when a bundle's times
    show the silence."""

    first_line: int
    last_line: int
    lines: int
    running: int
    engine: str | None
    text: bytes
    last_text: bytes = b""
    silent_s: float | None = None
    confirmed: bool = True


@dataclass(frozen=True, slots=True)
class AnalysisExtra:
    """What the engine knows beyond SPEC §4's top-level keys.

    ``rule``, ``captures``, ``context`` and ``notes`` are written on the first failure's
    ``findings`` entry (as ``rule_name``/``summary``/``why``/``next_steps``/``rule_status``,
    ``captures``, ``context``, ``notes``); the other fields stay in memory.
    """

    #: the first failure's pattern captures (name -> text), in pattern order
    captures: tuple[tuple[str, str], ...] = ()
    rule: RuleInfo | None = None
    context: FailureContext | None = None
    notes: tuple[str, ...] = ()
    findings_truncated: int = 0  # findings dropped past the cap
    long_lines_truncated: int = 0  # lines cut to the kept length
    shutdown_requested_line: int | None = None
    ready_line: int | None = None
    #: the first run of zero-progress stats lines with requests running (analysis/serving_stall)
    serving_stall: ServingStall | None = None

    @classmethod
    def from_finding_json(cls, entry: object) -> AnalysisExtra:
        """Read the extras back from a first-failure ``findings`` entry of an analysis JSON
        (0.1 or 0.2: missing or mistyped keys give empty fields)."""
        e = entry if isinstance(entry, dict) else {}
        caps = e.get("captures")
        steps = e.get("next_steps")
        rule = None
        if isinstance(e.get("rule_name"), str):
            rule = RuleInfo(
                name=str(e["rule_name"]), summary=str(e.get("summary") or ""),
                why=str(e.get("why") or ""),
                next_steps=tuple(str(x) for x in steps) if isinstance(steps, list) else (),
                severity=str(e.get("severity") or "error"),
                status=str(e["rule_status"]) if isinstance(e.get("rule_status"), str) else None)
        notes = e.get("notes")
        return cls(
            captures=tuple((str(k), str(v)) for k, v in caps.items())
            if isinstance(caps, dict) else (),
            rule=rule,
            context=FailureContext.from_json(e["context"]) if "context" in e else None,
            notes=tuple(str(n) for n in notes) if isinstance(notes, list) else (),
        )


@dataclass(frozen=True, slots=True)
class Analysis:
    """The result of analysing one log (SPEC §4)."""

    source: str
    lines_total: int
    last_stage_reached: Stage | None
    stages: tuple[StageSpan, ...]
    first_failure: Finding | None
    consequences: tuple[Finding, ...]
    findings: tuple[Finding, ...]
    extra: AnalysisExtra = field(default_factory=AnalysisExtra)
    #: SPEC §4 (0.2): where and since when progress stopped (``basis == "stall"``), else None
    stall: dict[str, Any] | None = None
    #: SPEC §4 (0.2): the configuration vLLM itself reported at start, else None
    engine_config: dict[str, Any] | None = None
    #: additive (issue 16): what part of the input a budgeted analysis covered; None when
    #: the whole input was analysed without a budget
    coverage: JSONObject | None = None

    @property
    def failed(self) -> bool:
        return self.first_failure is not None

    def to_json(self) -> JSONObject:
        """The SPEC §4 object, with exactly its top-level keys.

        What the engine adds beyond the contract (pattern captures, context lines, the rule's
        name/summary/why/next steps, notes) rides on the first failure's entry in ``findings``,
        where extra keys are allowed.
        """
        ff = self.first_failure
        findings = [f.to_json() for f in self.findings]
        if ff is not None:
            for entry in findings:
                if entry["line_no"] == ff.line_no:
                    _attach_extras(entry, self.extra)
                    break
        return {
            "schema": ANALYSIS_SCHEMA,
            "source": self.source,
            "lines_total": self.lines_total,
            "last_stage_reached": self.last_stage_reached,
            "stages": [s.to_json() for s in self.stages],
            "first_failure": None
            if ff is None
            else {
                "stage": ff.stage,
                "category": ff.category,
                "rule": ff.rule,
                "line_no": ff.line_no,
                "text": ff.text,
                "process": ff.process,
                "basis": ff.basis,
                **({"ranks": list(ff.ranks)} if ff.ranks else {}),
            },
            "consequences": [
                {"line_no": c.line_no, "rule": c.rule, "text": c.text} for c in self.consequences
            ],
            "findings": [*findings],
            "stall": self.stall,
            "engine_config": self.engine_config,
            **({"coverage": self.coverage} if self.coverage is not None else {}),
        }


def _attach_extras(entry: dict[str, Any], extra: AnalysisExtra) -> None:
    entry["first_failure"] = True
    if extra.rule is not None:
        for key, value in extra.rule.to_json().items():
            if key != "severity":  # the finding has its own severity
                entry[{"name": "rule_name", "status": "rule_status"}.get(key, key)] = value
    if extra.captures:
        entry["captures"] = dict(extra.captures)
    if extra.context is not None:
        entry["context"] = extra.context.to_json()
    if extra.notes:
        entry["notes"] = list(extra.notes)


@dataclass(frozen=True, slots=True)
class Problem:
    """One validation problem: where it is and what is wrong (jsonschema-style, located)."""

    code: str  # stable short id, e.g. "path-traversal", "sha256-mismatch", "schema"
    message: str  # one line, says what to do next where it can
    member: str | None = None  # bundle member, e.g. "fingerprint.json"
    json_path: str | None = None  # e.g. "$.gpus[0].uuid"
    expected: str | None = None
    actual: str | None = None

    def to_json(self) -> JSONObject:
        return {
            "code": self.code,
            "message": self.message,
            "member": self.member,
            "json_path": self.json_path,
            "expected": self.expected,
            "actual": self.actual,
        }

    def __str__(self) -> str:
        where = self.member or "bundle"
        if self.json_path:
            where += f" {self.json_path}"
        return f"{where}: {self.message}"
