"""``Analysis.extra`` is typed (AnalysisExtra); the analysis JSON keeps its keys, and the extras
read back from a first-failure ``findings`` entry (0.1 and 0.2 JSON) give the same JSON."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kk3evidence.analysis.engine import analyze
from kk3evidence.model import AnalysisExtra, ContextLine, FailureContext, RuleInfo

REAL = Path(__file__).resolve().parent / "data" / "realruns"
CASES = sorted(p.parent.name for p in REAL.glob("*/output.log"))


def _first_entry(doc: dict[str, object]) -> dict[str, object]:
    findings = doc["findings"]
    assert isinstance(findings, list)
    return next(f for f in findings if f.get("first_failure"))


@pytest.mark.parametrize("case", CASES)
def test_extras_read_back_from_the_json_give_the_same_json(case: str) -> None:
    a = analyze(REAL / case / "output.log")
    doc = a.to_json()
    if a.first_failure is None:
        assert not any(f.get("first_failure") for f in doc["findings"])  # type: ignore[union-attr]
        return
    back = AnalysisExtra.from_finding_json(_first_entry(doc))
    assert (back.captures, back.context, back.notes) == (
        a.extra.captures, a.extra.context, a.extra.notes)
    # the entry's severity is the finding's; the rule's own is not written
    assert (back.rule and replace(back.rule, severity="")) == (
        a.extra.rule and replace(a.extra.rule, severity=""))
    assert json.dumps(replace(a, extra=back).to_json()) == json.dumps(doc)


def test_a_0_1_entry_without_rule_status_or_context_reads_as_empty_fields() -> None:
    entry = {"line_no": 7, "rule": "OOM001", "first_failure": True, "rule_name": "cuda-oom",
             "summary": "s", "why": "w", "next_steps": ["a", "b"]}
    extra = AnalysisExtra.from_finding_json(entry)
    assert extra.rule == RuleInfo("cuda-oom", "s", "w", ("a", "b"), "error", None)
    assert extra.context is None and extra.captures == () and extra.notes == ()
    assert "status" not in extra.rule.to_json()


def test_context_rows_of_another_shape_are_skipped() -> None:
    ctx = FailureContext.from_json({"before": [[1, "x"], ["2", "y"], [3], "z"], "after": 5})
    assert ctx == FailureContext(before=(ContextLine(1, "x"),), after=())


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)


@given(st.dictionaries(st.sampled_from(["rule_name", "summary", "why", "next_steps",
                                        "rule_status", "captures", "context", "notes"]),
                       _json) | _json)
def test_any_json_entry_reads_without_error(entry: object) -> None:
    extra = AnalysisExtra.from_finding_json(entry)
    assert isinstance(extra, AnalysisExtra)
