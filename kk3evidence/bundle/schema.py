"""JSON Schemas of the bundle members, and careful JSON parsing for bundles from others.

Every JSON member of a bundle has a schema in ``schemas/<name>.schema.json`` (draft 2020-12,
with ``$id`` and ``version``). :func:`parse_json` turns untrusted bytes into a Python value or
located :class:`~kk3evidence.model.Problem`\\ s (not UTF-8, invalid JSON, duplicate keys,
NaN/Infinity, nesting deeper than a limit) and never raises ``RecursionError``.
:func:`iter_schema_problems` yields one located problem per schema violation, like
``jsonschema``'s ``iter_errors``.

Version rule: each JSON member carries ``"schema": "kk3evidence/<kind>/v<MAJOR>[.<MINOR>]"``.
Minor versions only add optional fields, so a reader of v1 reads v1.x; a different major version
is refused with a message that says to upgrade (:func:`version_problem`).
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import re
import tomllib
from collections.abc import Iterator
from typing import NoReturn, TypeAlias

from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from jsonschema.exceptions import ValidationError  # type: ignore[import-untyped]

from kk3evidence import _resources
from kk3evidence.errors import Kk3Error
from kk3evidence.model import JSONObject, JSONValue, Problem

__all__ = [
    "MEMBER_SCHEMAS",
    "SCHEMA_IDS",
    "SUPPORTED_MAJOR",
    "TOMLTable",
    "TOMLValue",
    "iter_schema_problems",
    "json_depth",
    "json_shape",
    "load_schema",
    "load_toml",
    "parse_json",
    "schema_for_member",
    "version_problem",
]

SUPPORTED_MAJOR = 1

# member name -> schema file stem; every ``requests/*.json`` uses "request".
MEMBER_SCHEMAS: dict[str, str] = {
    "manifest.json": "manifest",
    "fingerprint.json": "fingerprint",
    "launch.json": "launch",
    "notes.json": "notes",
    "analysis.json": "analysis",
    "preflight.json": "preflight",
}

# schema file stem -> the ``schema`` string a v1 document carries.
SCHEMA_IDS: dict[str, str] = {
    "manifest": "kk3evidence/bundle/v1",
    "fingerprint": "kk3evidence/fingerprint/v1",
    "launch": "kk3evidence/launch/v1",
    "notes": "kk3evidence/notes/v1",
    "request": "kk3evidence/request/v1",
    "analysis": "kk3evidence/analysis/v1",
    "preflight": "kk3evidence/preflight/v1",
    "stall": "kk3evidence/stall/v1",
}

#: a TOML value as ``tomllib`` gives it: JSON's types (no null) plus dates and times; recursive
TOMLValue: TypeAlias = (
    "str | int | float | bool | datetime.datetime | datetime.date | datetime.time"
    " | list[TOMLValue] | dict[str, TOMLValue]"
)
#: a TOML document or table
TOMLTable: TypeAlias = "dict[str, TOMLValue]"

_FAMILY = {"manifest": "bundle"}
_VERSION_RE = re.compile(r"^kk3evidence/([a-z_]+)/v([0-9]{1,6})(?:\.([0-9]{1,6}))?$")
_SHOW = 80  # characters of a value quoted in a problem


def schema_for_member(member: str) -> str | None:
    """The schema stem for a bundle member name, or ``None`` if it is not a JSON member."""
    if member in MEMBER_SCHEMAS:
        return MEMBER_SCHEMAS[member]
    if member.startswith("requests/") and member.endswith(".json"):
        return "request"
    if member.startswith("stalls/") and member.endswith(".json"):
        return "stall"
    return None


@functools.cache
def load_schema(name: str) -> JSONObject:
    """The parsed schema ``schemas/<name>.schema.json`` shipped with the package."""
    loaded: JSONObject = json.loads(_resources.read_text("schemas", f"{name}.schema.json"))
    return loaded


def load_toml(
    text: str | bytes,
    source: str,
    *,
    error: type[Kk3Error],
    schema: str | None = None,
    schema_id: str | None = None,
) -> TOMLTable:
    """The one loader of our TOML data (rules, compatibility rules, flag classes, stage hints,
    ladder plans): parse, check the ``schema = "..."`` id when ``schema_id`` is given, validate
    against ``schemas/<schema>.schema.json`` when ``schema`` is given. Any problem raises
    ``error`` with a one-line message that says where (file, JSON path) and what to do.
    """
    try:
        doc = tomllib.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise error(f"{source}: not valid TOML ({exc}); fix the file") from None
    if schema_id is not None and doc.get("schema") != schema_id:
        raise error(f"{source}: $.schema is {doc.get('schema')!r}, expected {schema_id!r}")
    if schema is not None:
        errors = sorted(
            _validator(schema).iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))
        )
        if errors:
            e = errors[0]
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            raise error(
                f"{source}: {e.json_path}: {' '.join(e.message.split())[:200]}{more} "
                f"(see schemas/{schema}.schema.json)"
            )
    return doc


@functools.cache
def _validator(name: str) -> Draft202012Validator:
    schema = load_schema(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _short(value: object) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= _SHOW else text[: _SHOW - 1] + "…"


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _problem_from_error(err: ValidationError, member: str) -> Problem:
    validator = str(err.validator)
    expected: str | None
    actual: str | None = _short(err.instance)
    if validator == "type":
        expected = _short(err.validator_value)
        actual = _type_name(err.instance)
    elif validator == "required":
        expected = "the required field(s) present"
        actual = None
    elif validator in {"enum", "const", "pattern", "minimum", "maximum", "minLength", "maxLength"}:
        expected = f"{validator} {_short(err.validator_value)}"
    elif validator == "oneOf":
        expected = "one of the allowed shapes"
    else:
        expected = validator
    message = " ".join(err.message.split())
    if len(message) > 200:
        message = message[:199] + "…"
    return Problem(
        code="schema",
        message=f"does not match the schema: {message}",
        member=member,
        json_path=err.json_path,
        expected=expected,
        actual=actual,
    )


def iter_schema_problems(name: str, document: object, member: str) -> Iterator[Problem]:
    """Yield one located problem per violation of schema ``name`` by ``document``.

    ``document`` must come from :func:`parse_json` (depth already bounded).
    """
    errors = sorted(
        _validator(name).iter_errors(document), key=lambda e: (list(map(str, e.path)), e.message)
    )
    for err in errors:
        yield _problem_from_error(err, member)


def version_problem(document: object, name: str, member: str) -> Problem | None:
    """A problem if ``document['schema']`` names a major version this reader does not know.

    Anything that is not a ``kk3evidence/<kind>/vN`` string is left to the schema check.
    """
    if not isinstance(document, dict):
        return None
    value = document.get("schema")
    if not isinstance(value, str):
        return None
    m = _VERSION_RE.match(value)
    if m is None:
        return None
    family = _FAMILY.get(name, name)
    if m.group(1) != family:
        return Problem(
            code="schema",
            message=f"'schema' is {value!r} but {member} must be a kk3evidence/{family} document",
            member=member,
            json_path="$.schema",
            expected=f"kk3evidence/{family}/v{SUPPORTED_MAJOR}",
            actual=value,
        )
    major = int(m.group(2))
    if major == SUPPORTED_MAJOR:
        return None
    if major > SUPPORTED_MAJOR:
        message = (
            f"{_FAMILY.get(name, name)} schema {value} is newer than this kk3evidence "
            f"(reads v{SUPPORTED_MAJOR}); upgrade kk3evidence"
        )
    else:
        message = (
            f"{_FAMILY.get(name, name)} schema {value} is older than this kk3evidence "
            f"understands (reads v{SUPPORTED_MAJOR})"
        )
    return Problem(
        code="unsupported-version",
        message=message,
        member=member,
        json_path="$.schema",
        expected=f"kk3evidence/{family}/v{SUPPORTED_MAJOR}",
        actual=value,
    )


# --- careful JSON parsing -------------------------------------------------------------------


class _JsonRejected(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _reject_constant(name: str) -> NoReturn:
    raise _JsonRejected("json-nonfinite", f"{name} is not valid JSON (numbers must be finite)")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _JsonRejected("json-nonfinite", f"number {text[:40]} overflows to infinity")
    return value


def _pairs_hook(pairs: list[tuple[str, JSONValue]]) -> JSONObject:
    out: JSONObject = {}
    for key, value in pairs:
        if key in out:
            raise _JsonRejected("json-duplicate-key", f"duplicate key {_short(key)} in an object")
        out[key] = value
    return out


def json_depth(value: object) -> int:
    """Nesting depth of a parsed JSON value (scalars 0, ``[]`` 1), computed without recursion."""
    return json_shape(value)[0]


def json_shape(value: object) -> tuple[int, int]:
    """``(depth, nodes)`` of a parsed JSON value, computed without recursion."""
    deepest = 0
    nodes = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if isinstance(node, dict):
            depth += 1
            stack.extend((v, depth) for v in node.values())
        elif isinstance(node, list):
            depth += 1
            stack.extend((v, depth) for v in node)
        deepest = max(deepest, depth)
    return deepest, nodes


def parse_json(
    data: bytes, member: str, *, max_depth: int = 64, max_nodes: int = 1_000_000
) -> tuple[JSONValue, list[Problem]]:
    """Parse untrusted JSON bytes. Returns ``(value, [])`` or ``(None, [problem])``.

    Refuses what ``json.loads`` would accept but a portable reader should not: bytes that are
    not UTF-8 (or start with a BOM), NaN/Infinity, numbers overflowing to infinity, duplicate
    object keys, nesting deeper than ``max_depth``, and more than ``max_nodes`` values (schema
    checking costs time per value).
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, [
            Problem(
                code="json-not-utf8",
                message=f"is not UTF-8 (invalid byte at offset {exc.start})",
                member=member,
                expected="UTF-8 JSON",
                actual=f"byte 0x{data[exc.start]:02x} at offset {exc.start}",
            )
        ]
    if text.startswith("\ufeff"):
        return None, [
            Problem(code="json-invalid", message="starts with a byte-order mark", member=member)
        ]
    try:
        value = json.loads(
            text,
            object_pairs_hook=_pairs_hook,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
        )
    except _JsonRejected as exc:
        return None, [Problem(code=exc.code, message=str(exc), member=member)]
    except RecursionError:
        return None, [
            Problem(
                code="json-too-deep",
                message=f"JSON is nested deeper than {max_depth} levels",
                member=member,
                expected=f"depth <= {max_depth}",
            )
        ]
    except json.JSONDecodeError as exc:
        return None, [
            Problem(
                code="json-invalid",
                message=f"is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                member=member,
            )
        ]
    except ValueError as exc:  # e.g. an integer with more digits than Python allows
        return None, [
            Problem(code="json-invalid", message=f"is not valid JSON: {exc}", member=member)
        ]
    depth, nodes = json_shape(value)
    if nodes > max_nodes:
        return None, [
            Problem(
                code="json-too-large",
                message=f"JSON has {nodes} values (limit {max_nodes}); too large to check",
                member=member,
                expected=f"<= {max_nodes} values",
                actual=str(nodes),
            )
        ]
    if depth > max_depth:
        return None, [
            Problem(
                code="json-too-deep",
                message=f"JSON is nested {depth} levels deep (limit {max_depth})",
                member=member,
                expected=f"depth <= {max_depth}",
                actual=str(depth),
            )
        ]
    return value, []
