"""``kk3evidence rules list|show|export|doc|check``: the rules as docs, JSON, a pack."""

from __future__ import annotations

import click

from kk3evidence.analysis.rules import Rule, check_rules, load_rules, render_rules_doc
from kk3evidence.errors import UsageError

from ._common import echo_json, handle_errors


@click.group(name="rules")
def command() -> None:
    """List and show the failure, consequence, milestone and noise rules (rules/*.toml)."""


@command.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print every rule as JSON.")
@click.option(
    "--kind",
    type=click.Choice(["failure", "consequence", "milestone", "noise"]),
    help="Only rules of this kind.",
)
@handle_errors
def list_rules(as_json: bool, kind: str | None) -> None:
    """One line per rule: id, kind, stage, category, severity, status, name."""
    rules = [r for r in load_rules() if kind is None or r.kind == kind]
    rules.sort(key=lambda r: r.id)
    if as_json:
        echo_json([r.to_json() for r in rules])
        return
    for r in rules:
        click.echo(
            f"{r.id:<9} {r.kind:<11} {r.stage or '-':<17} {r.category or '-':<15} "
            f"{r.severity:<8} {r.status:<12} {r.name}"
        )


def _show(r: Rule) -> str:
    lines = [f"{r.id}  {r.name}", f"  {r.summary}"]
    facts = [f"kind={r.kind}", f"severity={r.severity}", f"status={r.status}"]
    if r.stage:
        facts.insert(1, f"stage={r.stage}")
    if r.category:
        facts.insert(2, f"category={r.category}")
    lines.append("  " + " ".join(facts) + f"  (from rules/{r.source})")
    if r.why:
        lines += ["", f"Why: {r.why}"]
    if r.next_steps:
        lines += ["", "Next steps:"] + [f"  {i}. {s}" for i, s in enumerate(r.next_steps, 1)]
    lines += ["", "Anchors: " + (", ".join(repr(a) for a in r.anchors) or "(none)")]
    for src in r.pattern_sources:
        lines.append(f"Pattern: {src}")
    if r.match:
        lines += ["", "Matches:"] + [f"  {m}" for m in r.match]
    if r.no_match:
        lines += ["", "Does not match:"] + [f"  {m}" for m in r.no_match]
    return "\n".join(lines)


@command.command(name="show")
@click.argument("rule_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the rule as JSON.")
@handle_errors
def show_rule(rule_id: str, as_json: bool) -> None:
    """Everything about one rule: what, why, next steps, grammar and examples."""
    rs = load_rules()
    r = rs.get(rule_id) or rs.get(rule_id.upper())
    if r is None:
        raise UsageError(f"no rule {rule_id!r}; 'kk3evidence rules list' shows every id")
    if as_json:
        echo_json(r.to_json())
    else:
        click.echo(_show(r))


@command.command(name="doc")
@handle_errors
def rules_doc() -> None:
    """Print the rule reference (docs/rules.md is this output; a test keeps it current)."""
    click.echo(render_rules_doc(), nl=False)


@command.command(name="check")
@handle_errors
def rules_check() -> None:
    """Validate every shipped rule file strictly (schema, every pattern, every example)."""
    rs = check_rules()
    click.echo(f"{len(rs)} rules OK")


@command.command(name="export")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json"]),
    default="json",
    show_default=True,
    help="Pack format (schemas/rule-pack.schema.json).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the pack to this file instead of stdout.",
)
@handle_errors
def export_rules(fmt: str, output: str | None) -> None:
    """Every rule as one versioned rule pack other tools can embed: anchors, the grammar as a
    portable regex, examples with the body they match, stage, category, status, since,
    references."""
    from kk3evidence.analysis.rulepack import export_pack

    pack = export_pack()
    if output is None:
        echo_json(pack)
        return
    import json
    from pathlib import Path

    try:
        Path(output).write_text(json.dumps(pack, indent=2, ensure_ascii=False) + "\n", "utf-8")
    except OSError as err:
        raise UsageError(f"{output}: cannot write the rule pack ({err.strerror})") from None
    click.echo(f"wrote {output}: {len(load_rules())} rules, kk3evidence {pack['version']}")
