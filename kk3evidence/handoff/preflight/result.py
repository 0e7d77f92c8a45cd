"""Pre-flight check results: one record per check, and the whole run (``preflight.json``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from kk3evidence.errors import EXIT_INCOMPATIBLE, EXIT_OK

__all__ = ["SCHEMA", "STATUSES", "Check", "PreflightResult", "Status"]

SCHEMA = "kk3evidence/preflight/v1"
Status = Literal["pass", "fail", "warn", "unknown"]
STATUSES: tuple[Status, ...] = ("fail", "warn", "unknown", "pass")  # the order humans read
AREAS = ("model", "memory", "flags", "host", "recipe")


@dataclass(frozen=True, slots=True)
class Check:
    """One check's verdict with the evidence it used and where its boundary comes from."""

    id: str  # stable, e.g. "model.weights"
    area: str  # model | memory | flags | host | recipe
    status: Status
    summary: str  # one line: what was found
    evidence: tuple[str, ...] = ()  # "where: value" strings the verdict used
    next_step: str | None = None  # what to do (fail / warn)
    source: str | None = None  # where the boundary or fact comes from
    source_date: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "area": self.area,
            "status": self.status,
            "summary": self.summary,
            "evidence": list(self.evidence),
            "next_step": self.next_step,
            "source": self.source,
            "source_date": self.source_date,
        }


@dataclass(frozen=True, slots=True)
class PreflightResult:
    """All checks of one pre-flight run of one command."""

    argv: tuple[str, ...]
    recipe: str | None
    recipe_auto: bool
    started_at: str
    seconds: float
    checks: tuple[Check, ...]
    host: Mapping[str, object]  # a few host facts for the reader (hostname, vLLM, GPUs)

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status == "fail")

    @property
    def exit_code(self) -> int:
        return EXIT_INCOMPATIBLE if self.failed else EXIT_OK

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(("pass", "fail", "warn", "unknown"), 0)
        for c in self.checks:
            out[c.status] += 1
        return out

    def ordered(self) -> list[Check]:
        """Fails first, then warnings, unknowns, passes; stable within each."""
        return sorted(self.checks, key=lambda c: STATUSES.index(c.status))

    def to_json(self) -> dict[str, object]:
        return {
            "schema": SCHEMA,
            "argv": list(self.argv),
            "recipe": self.recipe,
            "recipe_auto": self.recipe_auto,
            "started_at": self.started_at,
            "seconds": round(self.seconds, 3),
            "ok": not self.failed,
            "counts": self.counts(),
            "host": dict(self.host),
            "checks": [c.to_json() for c in self.checks],
        }
