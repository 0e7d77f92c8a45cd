"""Adversarial long lines cost work in proportion to their length (or to a fixed cap), never
its square. Work is *counted*, not timed: pyparsing element attempts for every rule's grammar,
and characters handed to the regular expressions of the envelope parser and the redactor, at
n and 2n characters (and at 600 KB, past the cap on what a rule matches)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any

import pyparsing as pp
import pytest

from kk3evidence.analysis import envelope, grammar
from kk3evidence.analysis.grammar import parse_line
from kk3evidence.analysis.rules import load_rules
from kk3evidence.bundle import redact
from kk3evidence.bundle.redact import Redactor

UNITS = [
    "(APIServer pid=1) ",
    "(EngineCore_DP0 pid=12) ERROR ",
    "(VllmWorker rank=1 pid=2) ",
    "[rank0]: ",
    "host:1:2 [0] NCCL WARN ",
    "INFO 11-30 01:47:53 [model.py:2152] ",
    "\x1b[1;36m(APIServer pid=1)\x1b[0;0m ",
    'File "x.py", line 1, in f ',
    "> ",
    "RuntimeError: CUDA error: ",
    "password=",
    "Authorization: Bearer ",
    "-----BEGIN PRIVATE KEY-----",
    '"token": "',
    "Cookie: a=",
    " -u a:",
    "sk-",
    "hf_",
    "eyJa.eyJb.",
    "://a:",
    " ",
]


def _line(unit: str, n: int) -> str:
    return (unit * (n // len(unit) + 1))[:n]


class _Counting:
    """Stands in for a compiled regex and counts the characters it is given."""

    def __init__(self, inner: re.Pattern[Any], counter: list[int]) -> None:
        self._inner = inner
        self._counter = counter

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in ("match", "search", "fullmatch", "finditer", "findall", "sub", "split"):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            text = args[1] if name == "sub" else args[0]
            self._counter[0] += len(text)
            return attr(*args, **kwargs)

        return counted


@pytest.fixture
def counted_regexes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    counter = [0]
    for mod in (grammar, envelope, redact):
        for name, value in vars(mod).items():
            if isinstance(value, re.Pattern):
                monkeypatch.setattr(mod, name, _Counting(value, counter))
    # The envelope formats hold their own expressions: count those too.
    counted_formats = tuple(
        dataclasses.replace(f, regex=_Counting(f.regex, counter))  # type: ignore[arg-type]
        for f in envelope.FORMATS
    )
    monkeypatch.setattr(envelope, "_TABLES", envelope._build_tables(counted_formats))
    patterns = tuple(
        redact._Pattern(p.kind, p.anchors, _Counting(p.regex, counter), p.boundary, p.on_lower)  # type: ignore[arg-type]
        for p in redact._PATTERNS
    )
    monkeypatch.setattr(redact, "_PATTERNS", patterns)
    yield counter


def _cost(counter: list[int], work: Callable[[str], object], text: str) -> int:
    counter[0] = 0
    work(text)
    return counter[0]


@pytest.mark.parametrize("unit", UNITS)
def test_envelope_and_redactor_regex_work_is_linear(unit: str, counted_regexes: list[int]) -> None:
    for work in (lambda s: parse_line(1, s), lambda s: Redactor().text(s + "\n")):
        small = _cost(counted_regexes, work, _line(unit, 50_000))
        double = _cost(counted_regexes, work, _line(unit, 100_000))
        assert double <= 2.2 * small + 1000, (unit, small, double)


@pytest.fixture(scope="module")
def attempts() -> Iterator[list[int]]:
    counter = [0]
    original = pp.ParserElement._parseNoCache

    def counting(self: pp.ParserElement, *args: Any, **kwargs: Any) -> Any:
        counter[0] += 1
        return original(self, *args, **kwargs)

    pp.ParserElement._parseNoCache = counting  # type: ignore[method-assign]
    pp.ParserElement._parse = counting  # type: ignore[method-assign]
    try:
        yield counter
    finally:
        pp.ParserElement._parseNoCache = original  # type: ignore[method-assign]
        pp.ParserElement._parse = original  # type: ignore[method-assign]


def _rule_units(rule: Any) -> list[str]:
    """Adversarial units that reach this rule's grammar: its own first example line, its
    anchors, and process prefixes (the anchors let the line past the fast pre-filter)."""
    units = [" ".join(rule.anchors) + " " if rule.anchors else "x "]
    if rule.match:
        units.append(rule.match[0].rstrip("\n") + " ")
    units.append("(APIServer pid=1) " + units[0])
    return units


@pytest.mark.slow
def test_every_rule_grammar_does_bounded_work_on_adversarial_lines(attempts: list[int]) -> None:
    rules = list(load_rules())
    assert len(rules) > 100
    reached = 0
    for rule in rules:
        for unit in _rule_units(rule):
            cost = {}
            for n in (4_000, 8_000, 600_000):
                text = _line(unit, n)
                attempts[0] = 0
                rule.matches_text(text)
                rule.matches_text(text, exception_line=True)
                cost[n] = attempts[0]
            reached += cost[8_000] > 0
            # linear below the cap, and the cap holds: 600 KB costs what ~16 KB does
            assert cost[8_000] <= 2.5 * cost[4_000] + 200, (rule.id, unit[:40], cost)
            assert cost[600_000] <= 5 * cost[8_000] + 400, (rule.id, unit[:40], cost)
    assert reached > len(rules)  # the grammars really ran, not only the pre-filter
