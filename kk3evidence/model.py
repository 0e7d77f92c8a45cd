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

    def to_json(self) -> dict[str, Any]:
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

    def to_json(self) -> dict[str, Any]:
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
class Analysis:
    """The result of analysing one log (SPEC §4)."""

    source: str
    lines_total: int
    last_stage_reached: Stage | None
    stages: tuple[StageSpan, ...]
    first_failure: Finding | None
    consequences: tuple[Finding, ...]
    findings: tuple[Finding, ...]
    extra: dict[str, Any] = field(default_factory=dict)
    #: SPEC §4 (0.2): where and since when progress stopped (``basis == "stall"``), else None
    stall: dict[str, Any] | None = None
    #: SPEC §4 (0.2): the configuration vLLM itself reported at start, else None
    engine_config: dict[str, Any] | None = None
    #: additive (issue 16): what part of the input a budgeted analysis covered; None when
    #: the whole input was analysed without a budget
    coverage: dict[str, Any] | None = None

    @property
    def failed(self) -> bool:
        return self.first_failure is not None

    def to_json(self) -> dict[str, Any]:
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
            "findings": findings,
            "stall": self.stall,
            "engine_config": self.engine_config,
            **({"coverage": self.coverage} if self.coverage is not None else {}),
        }


def _attach_extras(entry: dict[str, Any], extra: dict[str, Any]) -> None:
    entry["first_failure"] = True
    info = extra.get("first_failure_rule") or {}
    for key in ("name", "summary", "why", "next_steps", "status"):
        if key in info:
            entry[{"name": "rule_name", "status": "rule_status"}.get(key, key)] = info[key]
    for src, dst in (
        ("first_failure_captures", "captures"),
        ("first_failure_context", "context"),
        ("notes", "notes"),
    ):
        if src in extra:
            entry[dst] = extra[src]


@dataclass(frozen=True, slots=True)
class Problem:
    """One validation problem: where it is and what is wrong (jsonschema-style, located)."""

    code: str  # stable short id, e.g. "path-traversal", "sha256-mismatch", "schema"
    message: str  # one line, says what to do next where it can
    member: str | None = None  # bundle member, e.g. "fingerprint.json"
    json_path: str | None = None  # e.g. "$.gpus[0].uuid"
    expected: str | None = None
    actual: str | None = None

    def to_json(self) -> dict[str, Any]:
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
