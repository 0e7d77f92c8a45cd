"""The first causal failure the whole analyzer reports for a log given as text (tests' helper)."""

from __future__ import annotations

from kk3evidence.analysis.engine import analyze
from kk3evidence.model import Finding


def first_failure(log: str | bytes, *, stopped: bool = False) -> Finding | None:
    return analyze(log.encode() if isinstance(log, str) else log, stopped=stopped).first_failure
