"""The JSON Schemas shipped in schemas/: well-formed, versioned, in step with the vocabulary."""

from __future__ import annotations

import json
from typing import Any

import pytest
from bundle_factory import (
    analysis_doc,
    fingerprint_doc,
    launch_doc,
    manifest_doc,
    notes_doc,
    request_doc,
    valid_files,
)
from jsonschema import Draft202012Validator

from kk3evidence.bundle.schema import (
    SCHEMA_IDS,
    iter_schema_problems,
    json_depth,
    load_schema,
    parse_json,
    schema_for_member,
    version_problem,
)
from kk3evidence.model import CATEGORIES, STAGES, Analysis, AnalysisExtra, Finding, StageSpan

NAMES = ["manifest", "fingerprint", "launch", "notes", "request", "analysis"]


@pytest.mark.parametrize("name", NAMES)
def test_schema_is_draft_2020_12_with_id_and_version(name: str) -> None:
    schema = load_schema(name)
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == f"urn:kk3evidence:schema:{name}:v1"
    assert schema["version"].startswith("1.")
    assert "schema" in schema["required"]
    assert schema["properties"]["schema"]["pattern"].startswith(f"^{SCHEMA_IDS[name]}")


def _enums(node: Any, found: list[list[str]]) -> None:
    if isinstance(node, dict):
        if "enum" in node and all(isinstance(x, str) for x in node["enum"]):
            found.append(node["enum"])
        for v in node.values():
            _enums(v, found)
    elif isinstance(node, list):
        for v in node:
            _enums(v, found)


@pytest.mark.parametrize("name", ["launch", "analysis"])
def test_stage_and_category_enums_match_the_vocabulary(name: str) -> None:
    found: list[list[str]] = []
    _enums(load_schema(name), found)
    assert list(STAGES) in found
    if name == "analysis":
        assert list(CATEGORIES) in found


@pytest.mark.parametrize(
    ("name", "doc"),
    [
        ("manifest", manifest_doc(valid_files())),
        ("fingerprint", fingerprint_doc()),
        ("launch", launch_doc()),
        ("notes", notes_doc()),
        ("request", request_doc()),
        ("analysis", analysis_doc()),
    ],
)
def test_factory_documents_are_valid(name: str, doc: dict[str, Any]) -> None:
    assert list(iter_schema_problems(name, doc, "x")) == []


def test_analysis_schema_matches_spec_section_4_exactly() -> None:
    schema = load_schema("analysis")
    assert schema["required"] == [
        "schema",
        "source",
        "lines_total",
        "last_stage_reached",
        "stages",
        "first_failure",
        "consequences",
        "findings",
    ]
    ff = schema["properties"]["first_failure"]
    assert ff["type"] == ["object", "null"]
    assert ff["required"] == ["stage", "category", "rule", "line_no", "text", "process"]
    cons = schema["properties"]["consequences"]["items"]
    assert cons["required"] == ["line_no", "rule", "text"]


def test_model_analysis_to_json_validates() -> None:
    f = Finding(4, "OOM001", "engine_init", "oom", "failure", "CUDA out of memory", "rank0")
    c = Finding(5, "CONS001", "engine_init", None, "consequence", "failed", caused_by=4)
    a = Analysis(
        source="x.log",
        lines_total=5,
        last_stage_reached="engine_init",
        stages=(StageSpan("engine_init", "failed", 1, 5),),
        first_failure=f,
        consequences=(c,),
        findings=(f, c),
        extra=AnalysisExtra(notes=("k",)),
    )
    assert list(iter_schema_problems("analysis", a.to_json(), "analysis.json")) == []
    empty = Analysis("x", 0, None, (), None, (), ())
    assert list(iter_schema_problems("analysis", empty.to_json(), "analysis.json")) == []


def test_schema_problems_are_located() -> None:
    doc = launch_doc(exit_code="boom", stages_reached=["engine_init", "warp_drive"])
    problems = list(iter_schema_problems("launch", doc, "launch.json"))
    paths = {p.json_path for p in problems}
    assert "$.exit_code" in paths and "$.stages_reached[1]" in paths
    p = next(p for p in problems if p.json_path == "$.exit_code")
    assert (
        p.member == "launch.json" and p.expected == '["integer", "null"]' and p.actual == "string"
    )


def test_schema_for_member() -> None:
    assert schema_for_member("requests/fixed.json") == "request"
    assert schema_for_member("launch.json") == "launch"
    assert schema_for_member("logs/combined.log") is None


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ("kk3evidence/launch/v1", None),
        ("kk3evidence/launch/v1.4", None),
        ("kk3evidence/launch/v2", "unsupported-version"),
        ("kk3evidence/launch/v0", "unsupported-version"),
        ("kk3evidence/notes/v1", "schema"),
        ("something else", None),  # left to the schema check
    ],
)
def test_version_rule(value: str, code: str | None) -> None:
    p = version_problem({"schema": value}, "launch", "launch.json")
    assert (p.code if p else None) == code


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b'{"a": 1}', None),
        (b'{"a": 1, "a": 2}', "json-duplicate-key"),
        (b'{"a": NaN}', "json-nonfinite"),
        (b'{"a": -Infinity}', "json-nonfinite"),
        (b'{"a": 1e999}', "json-nonfinite"),
        (b'{"a": "\xff"}', "json-not-utf8"),
        (b"\xef\xbb\xbf{}", "json-invalid"),
        (b"{", "json-invalid"),
        (b"", "json-invalid"),
        (b"[" * 100_000 + b"]" * 100_000, "json-too-deep"),
        (b"[" * 65 + b"]" * 65, "json-too-deep"),
        (b"[" * 64 + b"]" * 64, None),
        (b"1" * 5000, "json-invalid"),
    ],
)
def test_parse_json_refuses_what_a_portable_reader_should(data: bytes, code: str | None) -> None:
    value, problems = parse_json(data, "m.json", max_depth=64)
    assert [p.code for p in problems] == ([] if code is None else [code])
    if code is None:
        assert value == json.loads(data)


def test_json_depth_is_iterative() -> None:
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    assert json_depth(deep) == 5001
    assert json_depth({"a": [1, {"b": None}]}) == 3
