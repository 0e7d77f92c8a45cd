"""Classify parsed lines with the rules: which rule (if any) claims a line.

Precedence when several rules could claim a line: noise, then consequence, then failure, then
milestone; within a kind the higher ``priority``, then file order; ``fallback`` rules come last.
The first rule whose anchors, levels, scope and pattern all agree claims the line.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kk3evidence._literals import LiteralScanner
from kk3evidence.analysis.grammar import LogLine, parse_line
from kk3evidence.analysis.rules import Rule, RuleSet, load_rules
from kk3evidence.model import Finding

__all__ = ["Classified", "Classifier", "classify_line"]


@dataclass(frozen=True, slots=True)
class Classified:
    """A line some rule claimed, with the rule and the pattern's named captures."""

    rule: Rule
    line: LogLine
    captures: dict[str, str] = field(default_factory=dict)

    def finding(
        self,
        *,
        stage: str | None = None,
        kind: str | None = None,
        caused_by: int | None = None,
        category: str | None = None,
    ) -> Finding:
        r = self.rule
        k = kind or r.kind
        return Finding(
            line_no=self.line.line_no,
            rule=r.id,
            stage=stage or r.stage or "container_init",
            category=category or r.category,
            kind=k,  # type: ignore[arg-type]
            text=self.line.text,
            process=self.line.process,
            severity=r.severity,
            caused_by=caused_by,
        )


class Classifier:
    """Rule lookup for one :class:`RuleSet`; cheap to keep, safe to reuse across logs."""

    def __init__(self, ruleset: RuleSet | None = None) -> None:
        self.ruleset = ruleset if ruleset is not None else load_rules()
        self._rank = {r.id: i for i, r in enumerate(self.ruleset.rules)}
        self._anchor_index = {a: i for i, a in enumerate(self.ruleset.anchors)}
        self._literals: LiteralScanner | None = None  # built on first use

    def anchor_ids(self, body: str) -> list[int]:
        """Anchor ids present in ``body`` (the slow, per-line way; the fast path uses
        :class:`~kk3evidence.analysis.prefilter.Prefilter` on whole blocks)."""
        lits = self._literals
        if lits is None:
            lits = self._literals = LiteralScanner(self.ruleset.anchors)
        return lits.ids(body)

    def word_category(self, body: str) -> str | None:
        """The category the rule set's own words in ``body`` point at, when they agree: a
        line no rule's grammar matched (a new wording of a known failure: `HIP out of memory`,
        a TCPStore `EADDRINUSE` in another envelope) still names its family through the
        anchors of the specific rules. ``None`` when no such anchor is present or they point at
        different categories."""
        cats = self.ruleset.anchor_categories
        found = {cats[i] for i in self.anchor_ids(body) if cats[i] is not None}
        return found.pop() if len(found) == 1 else None

    def candidates(self, anchor_ids: Iterable[int], line: LogLine) -> list[Rule]:
        rs = self.ruleset
        seen: dict[str, Rule] = {}
        for aid in anchor_ids:
            for r in rs.anchor_rules[aid]:
                seen.setdefault(r.id, r)
        if line.tb_role in ("exception", "detail"):
            for r in rs.anchorless:
                seen.setdefault(r.id, r)
        if len(seen) <= 1:
            return list(seen.values())
        rank = self._rank
        return sorted(seen.values(), key=lambda r: rank[r.id])

    def classify(
        self,
        line: LogLine,
        anchor_ids: Iterable[int] | None = None,
        *,
        shutdown_requested: bool = False,
    ) -> Classified | None:
        """The rule claiming ``line`` (noise included), or ``None``."""
        if line.tb_role in ("frame", "header", "separator"):
            return None
        ids = self.anchor_ids(line.text) if anchor_ids is None else anchor_ids
        for rule in self.candidates(ids, line):
            if rule.when == "shutdown" and not shutdown_requested:
                continue
            caps = rule.matches(line)
            if caps is not None:
                return Classified(rule=rule, line=line, captures=caps)
        return None


_DEFAULT: dict[int, Classifier] = {}


def _classifier() -> Classifier:
    rs = load_rules()
    got = _DEFAULT.get(id(rs))
    if got is None or got.ruleset is not rs:
        _DEFAULT.clear()
        got = _DEFAULT[id(rs)] = Classifier(rs)
    return got


def classify_line(text: str | bytes, *, exception_line: bool = False) -> Finding | None:
    """Classify one line on its own with the shipped rules.

    Returns a :class:`~kk3evidence.model.Finding` (``kind`` failure, consequence or milestone),
    or ``None`` for unclassified and noise lines. ``exception_line=True`` treats the line as
    the final exception line of a traceback (so exception-scope rules apply).
    """
    line = parse_line(1, text)
    if exception_line:
        from dataclasses import replace

        line = replace(line, tb_role="exception", tb_chain=0, tb_index=0)
    hit = _classifier().classify(line)
    if hit is None or hit.rule.kind == "noise":
        return None
    return hit.finding()
