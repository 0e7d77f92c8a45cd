"""``--full`` for report, diff and compare, and the note that says what was analysed.

A bundle without a stored analysis is analysed by these commands; by default only the first
256 MiB and the last 64 MiB of its log (issue 16: time stays bounded on multi-GB logs). When
that left a part out, the human output says so (stderr, and the report document itself) and
the JSON carries it additively under ``coverage``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import click

from kk3evidence.analysis.budget import describe
from kk3evidence.handoff.evidence import collect_coverage, full_analysis
from kk3evidence.model import JSONObject

from ._common import safe_text

F = TypeVar("F", bound=Callable[..., Any])

Seen = list[tuple[str, JSONObject]]


def full_option(f: F) -> F:
    return click.option(
        "--full", "full", is_flag=True,
        help="Analyse the whole log of a bundle that has no stored analysis.json (default: "
        "its first 256 MiB and last 64 MiB, the middle only counted; the output says when "
        "a part was left out).")(f)


@contextlib.contextmanager
def consumer_scope(full: bool) -> Iterator[Seen]:
    with full_analysis(full), collect_coverage() as seen:
        yield seen


def notes(seen: Seen) -> list[str]:
    return [f"{source}: {describe(cov)}" for source, cov in seen]


def echo_notes(seen: Seen, *, human: bool = False) -> None:
    """The notes on stderr; in a human output also as its last lines (a file it is saved to
    says what it covered)."""
    for line in map(safe_text, notes(seen)):  # a path as given may hold escapes
        click.echo(f"kk3evidence: note: {line}", err=True)
    if human:
        for line in map(safe_text, notes(seen)):
            click.echo(f"Analysis coverage: {line}")


def add_coverage(doc: Mapping[str, object], seen: Seen) -> Mapping[str, object]:
    """``doc`` with an additive ``coverage`` map (source -> coverage) when a part was left
    out; unchanged otherwise."""
    return {**doc, "coverage": dict(seen)} if seen else doc
