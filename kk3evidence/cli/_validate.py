"""``kk3evidence validate BUNDLE``: schema + sha256 + safety of a bundle, every problem listed."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kk3evidence.bundle.archive import best_problem, iter_problems
from kk3evidence.bundle.grouparchive import is_group_archive, opened_group_archive
from kk3evidence.errors import EXIT_INVALID, EXIT_OK
from kk3evidence.model import Problem

from ._common import echo_json, handle_errors


def _printable(text: str) -> str:
    """Escape what could fool a terminal (control characters, bidi overrides) in our output."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _line(problem: Problem) -> str:
    return _printable(_raw_line(problem))


def _raw_line(problem: Problem) -> str:
    line = str(problem)
    details = []
    if problem.expected is not None:
        details.append(f"expected {problem.expected}")
    if problem.actual is not None:
        details.append(f"got {problem.actual}")
    if details:
        line += f" ({', '.join(details)})"
    return f"{line} [{problem.code}]"


@click.command(name="validate")
@click.argument("bundle", metavar="BUNDLE")
@click.option("--json", "as_json", is_flag=True, help='Print {"valid": bool, "problems": [...]}.')
@handle_errors
def command(bundle: str, as_json: bool) -> None:
    """Check a bundle from anyone without extracting it: safe member names and types, sizes
    and sha256 against the manifest, JSON schemas and versions.

    Prints every problem, one per line (member, JSON path, what was expected and found).
    Exit 0 when the bundle is valid, 4 when it is not (or cannot be read), 2 on usage errors.
    A group archive (written by merge) is valid when its index matches and every node bundle
    in it is valid.
    """
    if Path(bundle).is_file() and is_group_archive(bundle):
        _group_archive(bundle, as_json)
        return
    problems = list(iter_problems(bundle))
    if as_json:
        echo_json(
            {
                "source": bundle,
                "valid": not problems,
                "problems": [p.to_json() for p in problems],
            }
        )
    else:
        for problem in problems:
            click.echo(_line(problem))
        if problems:
            n = len(problems)
            best = best_problem(problems)
            click.echo(
                _printable(
                    f"{bundle}: INVALID, {n} problem{'s' if n != 1 else ''}; most relevant: {best}"
                )
            )
        else:
            click.echo(f"{bundle}: valid kk3evidence bundle")
    sys.exit(EXIT_INVALID if problems else EXIT_OK)


def _group_archive(path: str, as_json: bool) -> None:
    with opened_group_archive(path) as nodes:
        found = [(Path(n).name, list(iter_problems(n))) for n in nodes]
    bad = [(name, p) for name, problems in found for p in problems]
    if as_json:
        echo_json(
            {
                "source": path,
                "valid": not bad,
                "nodes": [
                    {
                        "node": name,
                        "valid": not problems,
                        "problems": [p.to_json() for p in problems],
                    }
                    for name, problems in found
                ],
            }
        )
    else:
        for name, problem in bad:
            click.echo(f"{name}: {_line(problem)}")
        state = f"INVALID, {len(bad)} problems" if bad else "valid kk3evidence group archive"
        click.echo(_printable(f"{path}: {state} ({len(found)} node bundles)"))
    sys.exit(EXIT_INVALID if bad else EXIT_OK)
