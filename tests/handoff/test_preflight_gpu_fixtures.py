"""Pre-flight documents produced on a real NVIDIA H200 (docs/gpu-verification.md): they stay
valid against the schema and say what the real GPU said."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from kk3evidence.bundle.schema import load_schema

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "preflight-h200"

# case -> (memory.weights-fit status, flags.world-size status)
EXPECTED = {
    "fits": ("pass", "pass"),
    "too-big": ("fail", "pass"),
    "100GiB-alone": ("pass", "pass"),
    "100GiB-while-another-job-holds-40GiB": ("fail", "pass"),
    "60GiB-while-another-job-holds-100GiB": ("fail", "pass"),
    "tp2-one-gpu": ("pass", "fail"),
    "no-visible-gpu": ("fail", "fail"),
}


def _checks(case: str) -> dict[str, dict[str, object]]:
    doc = json.loads((FIXTURES / f"{case}.json").read_text())
    Draft202012Validator(load_schema("preflight")).validate(doc)
    return {str(c["id"]): c for c in doc["checks"]}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_h200_preflight_documents_keep_their_verdicts(case: str) -> None:
    checks = _checks(case)
    fit, world = EXPECTED[case]
    assert checks["memory.weights-fit"]["status"] == fit
    assert checks["flags.world-size"]["status"] == world
    assert any("GPUs: nvml" in str(e) for e in checks["memory.weights-fit"]["evidence"])  # type: ignore[attr-defined]


def test_memory_held_by_another_process_shrinks_the_budget() -> None:
    alone = _checks("100GiB-alone")["memory.weights-fit"]["summary"]
    shared = _checks("100GiB-while-another-job-holds-40GiB")["memory.weights-fit"]["summary"]
    assert "125.76 GiB budget" in str(alone)
    assert "85.25 GiB budget" in str(shared)
    assert _checks("100GiB-while-another-job-holds-40GiB")["host.gpu-jobs"]["status"] == "warn"
