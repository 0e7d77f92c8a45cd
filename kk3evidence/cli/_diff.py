"""``kk3evidence diff A B``: did exactly one variable change between two runs?"""

from __future__ import annotations

import sys

import click

from kk3evidence.handoff.diff import DiffResult, diff

from ._common import echo_json, handle_errors


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
@click.argument("bundle_a", metavar="A", type=click.Path())
@click.argument("bundle_b", metavar="B", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@handle_errors
def command(bundle_a: str, bundle_b: str, as_json: bool) -> None:
    """Compare two bundles: fingerprint, launch flags, environment, request and outcome.

    Counts the variables that changed (outcome differences and noise such as pids,
    timestamps, GPU memory in use and random ports are not variables). Exit 0 when at most
    one variable changed (it is named), 5 when several changed (each is named).
    """
    result = diff(bundle_a, bundle_b)
    if as_json:
        echo_json(result.to_json())
    else:
        click.echo(_human(result))
    sys.exit(result.exit_code)
