"""The milestone watcher's shortcuts (one anchor scan per line, the classification remembered by
body and level) give the milestones of the plain per-line classification (issue 13)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kk3evidence.analysis.classify import Classifier
from kk3evidence.analysis.grammar import parse_line
from kk3evidence.analysis.progress import MilestoneWatcher
from kk3evidence.analysis.rules import load_rules

CORPUS = Path(__file__).resolve().parents[2] / "corpus"
CASES = sorted(d.name for d in CORPUS.iterdir() if d.is_dir() and not d.name.startswith("b6-"))


def _reference(data: bytes) -> list[tuple[int, str]]:
    rs = load_rules()
    markers: dict[str, set[str]] = {}
    for r in rs.rules:
        if r.kind == "milestone" and r.stage:
            for a in r.anchors:
                markers.setdefault(a, set()).add(r.id)
    raw_markers = [a.encode() for a in markers]
    classifier = Classifier(rs)
    out = []
    for no, raw in enumerate(data.split(b"\n")[:-1], 1):
        if not any(a in raw for a in raw_markers):
            continue
        line = parse_line(no, raw)
        rule_ids = set().union(*(v for a, v in markers.items() if a in line.text))
        ids = [i for i, a in enumerate(rs.anchors) if a in line.text]
        hit = classifier.classify(line, ids)
        if hit is not None and hit.rule.id in rule_ids and hit.rule.stage is not None:
            out.append((no, hit.rule.id))
    return out


@pytest.mark.parametrize("case", CASES)
def test_watcher_milestones_equal_the_plain_classification(case: str) -> None:
    data = (CORPUS / case / "output.log").read_bytes()
    if not data.endswith(b"\n"):
        data += b"\n"
    data *= 3  # repeated bodies: the remembered path is taken
    got = MilestoneWatcher(full_lines=10**9).feed(data, 0.0)
    assert [(m.line_no, m.rule) for m in got] == _reference(data)
