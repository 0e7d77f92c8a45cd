"""The rule pack (`kk3evidence rules export --format json`): schema-valid, round-trips through
JSON, and its own examples run through its own portable regexes with Python `re` only (no
kk3evidence code on the matching side), the way an embedding tool would use it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kk3evidence._version import __version__
from kk3evidence.analysis.grammar import MAX_MATCH_CHARS, pattern_regex
from kk3evidence.analysis.rulepack import PACK_SCHEMA, export_pack
from kk3evidence.analysis.rules import load_rules

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "schemas" / "rule-pack.schema.json").read_text(encoding="utf-8"))
PACK: dict[str, Any] = json.loads(json.dumps(export_pack()))  # what a consumer reads
RULES = PACK["rules"]


def _accepts(rule: dict[str, Any], example: dict[str, Any]) -> bool:
    """The pack's matching recipe ('matching' in the pack), with Python `re` alone."""
    body = example["body"][:MAX_MATCH_CHARS]
    if rule["anchors"] and not any(a in body for a in rule["anchors"]):
        return False
    if rule["levels"] is not None and example["level"] not in (None, *rule["levels"]):
        return False
    where = example["source"]
    if rule["sources"] is not None and not (where and any(s in where for s in rule["sources"])):
        return False
    if not rule["patterns"]:
        return True
    return any(re.search(p["regex"], body) for p in rule["patterns"])


def test_pack_is_valid_against_its_schema_and_versioned() -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(PACK)
    assert PACK["schema"] == PACK_SCHEMA and PACK["version"] == __version__
    assert len(RULES) == len(load_rules()) and len({r["id"] for r in RULES}) == len(RULES)


def test_pack_is_deterministic_and_round_trips_through_json() -> None:
    again = export_pack()
    assert again == PACK
    assert again["rules_sha256"] == PACK["rules_sha256"]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r["id"])
def test_exported_match_examples_match_exported_patterns(rule: dict[str, Any]) -> None:
    for ex in rule["examples"]["match"]:
        assert _accepts(rule, ex), f"{rule['id']}: pack rejects its own example {ex['line']!r}"


# no_match examples that only the full engine rejects (traceback position, shutdown state):
# scope and when are in the pack, but a bare regex cannot see them.
def _context_only(rule: dict[str, Any]) -> bool:
    return rule["scope"] != "line" or rule["when"] is not None


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r["id"])
def test_exported_no_match_examples_are_rejected_by_exported_patterns(
    rule: dict[str, Any],
) -> None:
    if _context_only(rule):
        pytest.skip("rejection depends on the traceback/shutdown context, not the regex")
    for ex in rule["examples"]["no_match"]:
        assert not _accepts(rule, ex), f"{rule['id']}: pack accepts no_match {ex['line']!r}"


def test_portable_regex_uses_no_python_only_syntax() -> None:
    for rule in RULES:
        for p in rule["patterns"]:
            assert "(?P<" not in p["regex"] and "(?<" not in p["regex"], p["regex"]
            assert re.compile(p["regex"]).groups == len(p["captures"])


def test_pattern_regex_captures_in_group_order() -> None:
    rx, caps = pattern_regex("Worker {word} pid {int:pid} died, exit code: {num:code}")
    assert caps == ("pid", "code")
    m = re.search(rx, "Worker VllmWorkerProcess pid 78 died, exit code: -11")
    assert m is not None and m.groups() == ("78", "-11")
