"""``kk3evidence preflight -- vllm serve ...``: what can be known before a launch, in seconds."""

from __future__ import annotations

import sys

import click

from kk3evidence.capture.preflight_host import run_preflight
from kk3evidence.errors import UsageError
from kk3evidence.handoff.preflight import PreflightResult
from kk3evidence.vllm_args import is_vllm_serve

from ._common import echo_json, handle_errors

_MARK = {"pass": "PASS", "fail": "FAIL", "warn": "WARN", "unknown": "????"}


def render_human(result: PreflightResult, verbose: bool = False) -> str:
    """Fails first (with what to do), then warnings, unknowns and passes."""
    lines = [f"preflight: {' '.join(result.argv)}"]
    if result.recipe:
        lines.append(f"recipe: {result.recipe}"
                     + (" (picked from the served model)" if result.recipe_auto else ""))
    lines.append("")
    for c in result.ordered():
        lines.append(f"{_MARK[c.status]} {c.id}: {c.summary}")
        if c.status == "pass" and not verbose:
            continue
        if c.next_step:
            lines.append(f"       do: {c.next_step}")
        for e in c.evidence:
            lines.append(f"       evidence: {e}")
        if c.source:
            lines.append(f"       source: {c.source} ({c.source_date})")
    n = result.counts()
    verdict = ("a check failed: fix the FAIL lines before launching" if result.failed
               else "nothing failed")
    lines += ["", f"{n['fail']} fail, {n['warn']} warn, {n['unknown']} unknown, {n['pass']} pass "
              f"in {result.seconds:.2f} s - {verdict}"]
    return "\n".join(lines)


@click.command(name="preflight", context_settings={"ignore_unknown_options": True})
@click.option("--recipe", metavar="NAME",
              help="Also check a recipe's boundaries (e.g. kimi-k3). Default: picked from the "
                   "served model when one matches.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@click.option("-v", "--verbose", is_flag=True, help="Show the evidence of passing checks too.")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED, metavar="-- CMD...")
@handle_errors
def command(recipe: str | None, as_json: bool, verbose: bool, cmd: tuple[str, ...]) -> None:
    """Check a vllm serve command before launching it: model files, memory, flags, host, recipe.

    Every check ends pass, fail, warn or unknown with its evidence and, for facts, their source
    and date. Nothing is launched. Exit 0 when nothing failed, 6 when a check failed, 2 usage.
    """
    if not cmd:
        raise UsageError("give the command after --: kk3evidence preflight -- vllm serve MODEL ...")
    if not is_vllm_serve(cmd):
        raise UsageError(f"preflight checks a vLLM serve command, not {' '.join(cmd[:3])!r}; "
                         "usage: kk3evidence preflight -- vllm serve MODEL ...")
    result = run_preflight(list(cmd), recipe=recipe)
    if as_json:
        echo_json(result.to_json())
    else:
        click.echo(render_human(result, verbose))
    sys.exit(result.exit_code)
