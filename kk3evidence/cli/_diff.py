"""``kk3evidence diff A B``: did exactly one variable change between two runs?"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from kk3evidence.bundle.grouparchive import is_group_archive
from kk3evidence.errors import UsageError
from kk3evidence.handoff.diff import DiffResult, diff
from kk3evidence.handoff.group import GroupDiff, diff_group_sets, diff_groups

from ._budget import add_coverage, consumer_scope, echo_notes, full_option
from ._common import echo_json, handle_errors, safe_text
from ._merge import expand


def _human(result: DiffResult) -> str:
    lines = [f"A: {result.a}", f"B: {result.b}", ""]
    groups = (("fingerprint", "Environment fingerprint"), ("command", "Launch command"),
              ("env", "Environment variables"), ("request", "Request"))
    for group, title in groups:
        changes = [c for c in result.changes if c.group == group]
        if changes:
            lines.append(f"{title}:")
            lines += [f"  {'*' if c.counted else '-'} {c.describe()}" for c in changes]
    if result.outcome:
        lines.append("Outcome (what the change did; not counted):")
        lines += [f"  - {c.describe()}" for c in result.outcome]
    else:
        lines.append("Outcome: same (first failure, last stage, exit code, request status)")
    if result.equivalences:
        lines.append("Same meaning, different spelling:")
        lines += [f"  = {e}" for e in result.equivalences]
    if result.ignored:
        lines.append("Ignored as noise:")
        lines += [f"  ~ {i.what}: {i.why}" for i in result.ignored]
    lines.append("")
    verdict = result.summary()
    if result.verdict == "several":
        verdict += " - change one variable per round to know which one mattered"
    lines.append(f"Verdict: {verdict}")
    return "\n".join(lines)


@click.command(name="diff")
@click.argument("bundles", nargs=-1, required=True, metavar="A B | A0 A1.. B0 B1..",
                type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@full_option
@handle_errors
def command(bundles: tuple[str, ...], as_json: bool, full: bool) -> None:
    """Compare two bundles: fingerprint, launch flags, environment, request and outcome.

    Counts the variables that changed (outcome differences and noise such as pids,
    timestamps, GPU memory in use and random ports are not variables). Exit 0 when at most
    one variable changed (it is named), 5 when several changed (each is named).

    Two groups (more than two bundles): told apart by the group ids in their manifests, else
    the first half of the bundles is A and the second half B (or two merge archives); node N
    of A is compared with node N of B, and the verdict counts the variables changed on any
    node.
    """
    with consumer_scope(full) as seen:
        _diff(bundles, as_json, seen)


def _diff(bundles: tuple[str, ...], as_json: bool, seen: list[tuple[str, dict[str, Any]]]) -> None:
    archives = [b for b in bundles if Path(b).is_file() and is_group_archive(b)]
    if len(bundles) == 2 and len(archives) == 2:
        with expand((bundles[0],)) as a, expand((bundles[1],)) as b:
            _show_groups(diff_group_sets(a, b), as_json, seen)
        return
    if len(bundles) > 2:
        _show_groups(diff_groups(bundles), as_json, seen)
        return
    if len(bundles) != 2:
        raise UsageError("diff needs two bundles (A B) or the bundles of two groups")
    result = diff(bundles[0], bundles[1])
    if as_json:
        echo_json(add_coverage(result.to_json(), seen))
    else:
        click.echo(safe_text(_human(result)))
    echo_notes(seen, human=not as_json)
    sys.exit(result.exit_code)


def _show_groups(result: GroupDiff, as_json: bool, seen: list[tuple[str, dict[str, Any]]]) -> None:
    if as_json:
        echo_json(add_coverage(result.to_json(), seen))
    else:
        for node, d in result.pairs:
            click.echo(f"== {node}")
            click.echo(_human(d))
            click.echo("")
        for u in result.unpaired:
            click.echo(f"unpaired: {u}")
        click.echo(f"Group verdict: {result.summary()}")
    echo_notes(seen, human=not as_json)
    sys.exit(result.exit_code)
