"""Rule files: schema conformance, ids, names, examples (per rule), overlaps, generated docs."""

from __future__ import annotations

import json
import tomllib
import warnings
from pathlib import Path

import jsonschema
import pytest

from kk3evidence.analysis.classify import Classifier
from kk3evidence.analysis.grammar import parse_line
from kk3evidence.analysis.rules import (
    DOC_COMMAND,
    _is_rule_doc,
    iter_rule_problems,
    load_rule_files,
    load_rules,
    render_rules_doc,
)
from kk3evidence.errors import RuleError
from kk3evidence.model import CATEGORIES, STAGES

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "rules"
SCHEMA = json.loads((ROOT / "schemas" / "rule.schema.json").read_text(encoding="utf-8"))
RULE_FILES = sorted(
    p for p in RULES_DIR.glob("*.toml") if _is_rule_doc(p.read_text(encoding="utf-8"))
)
RULES = list(load_rules())


def test_rule_schema_is_a_valid_versioned_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$id"].endswith(":v1") and SCHEMA["version"].startswith("1.")


@pytest.mark.parametrize("path", RULE_FILES, ids=[p.name for p in RULE_FILES])
def test_rule_file_conforms_to_schema_and_semantics(path: Path) -> None:
    doc = tomllib.loads(path.read_text(encoding="utf-8"))
    problems = list(iter_rule_problems(doc, path.name))
    assert not problems, "\n".join(problems)


def test_rule_ids_are_unique_and_names_kebab_case() -> None:
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))
    for r in RULES:
        assert r.name == r.name.lower() and " " not in r.name and "_" not in r.name
        if r.stage is not None:
            assert r.stage in STAGES
        if r.category is not None:
            assert r.category in CATEGORIES
        assert r.match, f"{r.id} has no match example"


def test_every_stage_has_a_healthy_milestone() -> None:
    stages = {r.stage for r in RULES if r.kind == "milestone"}
    assert stages == set(STAGES)


def test_duplicate_ids_across_files_are_rejected(tmp_path: Path) -> None:
    text = (RULES_DIR / "noise.toml").read_text(encoding="utf-8")
    (tmp_path / "a.toml").write_text(text, encoding="utf-8")
    (tmp_path / "b.toml").write_text(text, encoding="utf-8")
    with pytest.raises(RuleError, match="also used in"):
        load_rule_files([tmp_path])


def test_malformed_rule_file_gives_located_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text(
        '[[rule]]\nid = "X1"\nname = "Bad Name"\nkind = "failure"\nsummary = "s"\n'
        'anchors = ["abc"]\nmatch = []\n',
        encoding="utf-8",
    )
    with pytest.raises(RuleError) as info:
        load_rule_files([tmp_path])
    assert "bad.toml" in str(info.value) and "\n" not in str(info.value)


def test_other_data_files_in_rules_folder_are_not_rule_files() -> None:
    assert not _is_rule_doc('schema = "kk3evidence/flag-classes/v1"\n[group."x"]\n')
    assert _is_rule_doc('schema = "kk3evidence/rules/v1"\n[[rule]]\n')


# -- examples: each rule alone, then through the whole classifier --------------------------------

_CLASSIFIER = Classifier()


def _examples(which: str) -> list[tuple[str, str]]:
    out = []
    for r in RULES:
        for i, ex in enumerate(getattr(r, which)):
            out.append((r.id, ex))
            _ = i
    return out


def _line_for(rule_id: str, text: str):
    r = next(x for x in RULES if x.id == rule_id)
    line = parse_line(1, text)
    if r.scope == "exception":
        from dataclasses import replace

        line = replace(line, tb_role="exception", tb_chain=0, tb_index=0)
    return r, line


MATCH = _examples("match")
NO_MATCH = _examples("no_match")


@pytest.mark.parametrize(
    ("rule_id", "text"), MATCH, ids=[f"{i}-match-{n}" for n, (i, _) in enumerate(MATCH)]
)
def test_rule_matches_its_match_example(rule_id: str, text: str) -> None:
    r, line = _line_for(rule_id, text)
    assert r.matches(line) is not None, f"{rule_id} does not match its example: {text!r}"


@pytest.mark.parametrize(
    ("rule_id", "text"), NO_MATCH, ids=[f"{i}-nomatch-{n}" for n, (i, _) in enumerate(NO_MATCH)]
)
def test_rule_does_not_match_its_no_match_example(rule_id: str, text: str) -> None:
    r, line = _line_for(rule_id, text)
    assert r.matches(line) is None, f"{rule_id} matches its no_match example: {text!r}"


@pytest.mark.parametrize(
    ("rule_id", "text"), MATCH, ids=[f"{i}-classifier-{n}" for n, (i, _) in enumerate(MATCH)]
)
def test_match_example_is_claimed_by_its_rule_through_the_whole_classifier(
    rule_id: str, text: str
) -> None:
    r, line = _line_for(rule_id, text)
    got = _CLASSIFIER.classify(line, shutdown_requested=r.when == "shutdown")
    if got is None and r.scope in ("level", "cut", "interleaved"):
        return  # the last resort: never the classifier's, only when a log states no failure
    assert got is not None, f"{rule_id}: nothing claims {text!r}"
    if got.rule.id == rule_id or r.fallback:
        return  # a fallback rule only gets what no other rule claims
    msg = f"overlap: {rule_id} example is claimed first by {got.rule.id}: {text!r}"
    # A different kind or category would misclassify the line: that is a bug. The same kind
    # and category is an overlap worth knowing about, not a wrong answer.
    assert (got.rule.kind, got.rule.category) == (r.kind, r.category), msg
    warnings.warn(msg, stacklevel=1)


# -- generated docs -----------------------------------------------------------------------------


def test_docs_rules_md_is_up_to_date() -> None:
    doc = ROOT / "docs" / "rules.md"
    current = doc.read_text(encoding="utf-8") if doc.exists() else ""
    assert current == render_rules_doc(), f"docs/rules.md is stale; regenerate: {DOC_COMMAND}"


def test_rules_doc_and_check_commands() -> None:
    from click.testing import CliRunner

    from kk3evidence.cli import main

    checked = CliRunner().invoke(main, ["rules", "check"])
    assert checked.exit_code == 0, checked.output
    assert "rules OK" in checked.output
    doc = CliRunner().invoke(main, ["rules", "doc"])
    assert doc.exit_code == 0
    assert doc.output == render_rules_doc()


def test_strict_loading_reports_a_bad_pattern_with_its_rule(tmp_path: Path) -> None:
    (tmp_path / "x.toml").write_text(
        'schema = "kk3evidence/rules/v1"\n[[rule]]\nid = "XX001"\nname = "x"\n'
        'kind = "failure"\nstage = "serving"\ncategory = "other"\nstatus = "stable"\n'
        'summary = "s"\nanchors = ["abcd"]\npattern = "abcd {nosuch}"\nmatch = ["abcd 1"]\n',
        encoding="utf-8",
    )
    with pytest.raises(RuleError, match=r"XX001.*unknown block"):
        load_rule_files([tmp_path])
