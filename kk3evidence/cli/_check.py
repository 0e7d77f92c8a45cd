"""``kk3evidence check BUNDLE``: official compatibility boundaries, pass / fail / unknown."""

from __future__ import annotations

import sys

import click

from kk3evidence.handoff import evidence as _evidence
from kk3evidence.handoff.compat import CheckResult, check, cpu_build
from kk3evidence.handoff.group import check_group

from ._budget import add_coverage, consumer_scope, echo_notes, full_option
from ._common import echo_json, handle_errors
from ._merge import expand

_MARK = {"pass": "PASS", "fail": "FAIL", "unknown": "UNKNOWN"}


def _mark(status: str, level: str) -> str:
    # A failed warning-level rule does not fail the check: it must not read as FAIL.
    return "WARN" if status == "fail" and level != "error" else _MARK[status]


def _human(result: CheckResult, cpu: list[str] | None = None) -> str:
    head = f"{result.source}: "
    if result.recipe:
        head += f"recipe {result.recipe}" + (" (picked from the served model)"
                                              if result.recipe_auto else "")
    else:
        head += "generic rules only (no --recipe given and none matches the model)"
    lines = [head]
    if cpu:
        lines.append("CPU build: " + "; ".join(cpu) + " - outside every CUDA boundary")
    lines.append("")
    for r in result.results:
        level = "" if r.rule.level == "error" else " (warning)"
        mark = _mark(r.status, r.rule.level)
        lines.append(f"{mark:7} {r.rule.id} {r.rule.name}{level}: {r.reason}")
        for e in r.evidence:
            lines.append(f"        evidence: {e}")
        if r.status == "fail":
            lines.append(f"        next: {r.rule.next_steps}")
        lines.append(f"        source: {r.rule.source} ({r.rule.source_date})")
    c = result.counts()
    lines.append("")
    failed = [f"{r.rule.id} {r.rule.name}" for r in result.failed if r.rule.level == "error"]
    verdict = "outside the compatibility boundaries: " + "; ".join(failed) if failed else (
        "within the boundaries that could be checked")
    lines.append(f"{c['pass']} pass, {c['fail']} fail, {c['unknown']} unknown - {verdict}")
    return "\n".join(lines)


@click.command(name="check")
@click.argument("bundles", nargs=-1, required=True, type=click.Path(),
                metavar="BUNDLE [BUNDLE...]")
@click.option("--recipe", metavar="NAME",
              help="Also apply a recipe's boundaries (e.g. kimi-k3). Default: picked from the "
                   "served model when one matches.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@full_option
@handle_errors
def command(bundles: tuple[str, ...], recipe: str | None, as_json: bool, full: bool) -> None:
    """Check BUNDLE against compatibility rules kept as data (rules/compat/*.toml).

    Every rule ends pass, fail or unknown with the evidence it used and its source URL and
    date. Exit 0 when no error-level rule fails, 6 when one does.

    Several bundles of one group (or its merge archive): each node is checked, and the nodes
    must agree on image, vLLM/PyTorch/NCCL versions, driver, NCCL_*/GLOO_*/VLLM_* environment
    and argv (apart from per-node flags); any difference fails the group (exit 6).
    """
    with expand(bundles) as paths:
        if len(paths) > 1:
            _group(tuple(paths), recipe, as_json)
            return
    with consumer_scope(full) as seen:
        ev = _evidence.load(bundles[0])
    result = check(ev, recipe)
    cpu = cpu_build(ev)
    if as_json:
        echo_json(add_coverage({**result.to_json(), "cpu_build": cpu is not None}, seen))
    else:
        click.echo(_human(result, cpu))
    echo_notes(seen, human=not as_json)
    sys.exit(result.exit_code)


def _group(bundles: tuple[str, ...], recipe: str | None, as_json: bool) -> None:
    result = check_group(bundles, recipe)
    if as_json:
        echo_json(result.to_json())
    else:
        for node, r in result.nodes:
            click.echo(f"== {node}")
            click.echo(_human(r))
            click.echo("")
        click.echo("== consistency across nodes")
        if not result.consistency:
            click.echo("same versions, NCCL_*/GLOO_*/VLLM_* environment and argv on every node")
        for d in result.consistency:
            click.echo(f"FAIL {d['what']}: {d['message']}")
    sys.exit(result.exit_code)
