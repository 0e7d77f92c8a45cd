"""``kk3evidence compare BUNDLE...``: runs side by side, stability, and the guide's decision."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

import click

from kk3evidence.errors import UsageError

if TYPE_CHECKING:
    from kk3evidence.handoff.compare import Comparison

from ._budget import add_coverage, consumer_scope, echo_notes, full_option
from ._common import echo_json, handle_errors, safe_text

_COLUMNS = ("run", "environment", "config", "driver", "image_id", "vllm", "gpus",
            "within_boundaries", "signature")


def _table(rows: list[dict[str, object]], columns: tuple[str, ...]) -> list[str]:
    def cell(v: object) -> str:
        s = "-" if v is None else str(v)
        return s if len(s) <= 40 else s[:18] + "…" + s[-20:]

    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    out = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    out += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
            for row in cells]
    return out


def _compare_module() -> ModuleType:
    """``compare`` is the one command that needs polars: a slim install may lack it."""
    try:
        return importlib.import_module("kk3evidence.handoff.compare")
    except ModuleNotFoundError as exc:
        if exc.name != "polars":
            raise
        raise UsageError(
            "compare needs polars, which this install lacks: pip install 'kk3evidence[compare]'"
        ) from None


def _human(result: Comparison) -> str:
    lines = [f"Runs ({result.runs.height}):"]
    lines += ["  " + s for s in _table(result.runs.to_dicts(), _COLUMNS)]
    lines.append("")
    lines.append("Groups (identical configuration, same environment):")
    for g in result.groups:
        sigs = ", ".join(f"{s} x{n}" for s, n in g.signatures.items())
        lines.append(f"  {g.config} [{g.environment}] {len(g.runs)} run(s): {g.stability} "
                     f"- {sigs}")
        for k, vals in g.varying_fingerprint.items():
            lines.append(f"      fingerprint {k} varies: {', '.join(vals)}")
    lines.append("")
    d = result.decision
    lines.append(f"Decision: {d.text}")
    lines += [f"  because {r}" for r in d.reasons]
    lines += [f"  evidence: {e}" for e in d.evidence]
    return "\n".join(lines)


@click.command(name="compare")
@click.argument("bundles", nargs=-1, type=click.Path())
@click.option("--isolated", "isolated", multiple=True, type=click.Path(),
              metavar="BUNDLE",
              help="A bundle captured in the isolated environment (repeatable; also compared).")
@click.option("--isolated-host", "isolated_hosts", multiple=True, metavar="HOST",
              help="Runs whose fingerprint host is HOST belong to the isolated environment.")
@click.option("--json", "as_json", is_flag=True, help="Rows, groups and decision as JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="One CSV row per run.")
@full_option
@handle_errors
def command(bundles: tuple[str, ...], isolated: tuple[str, ...],  # noqa: PLR0917
            isolated_hosts: tuple[str, ...], as_json: bool, as_csv: bool, full: bool) -> None:
    """Compare runs: a row per run (configuration and outcome), runs grouped by identical
    configuration, how stable the first failing stage is across repeats, and the guide's
    decision - keep fixing here, move to an isolated environment, or hand off upstream -
    with the evidence that triggered it.

    Runs are in the isolated environment when given with --isolated, when their host is an
    --isolated-host, or when their notes.json says 'environment: isolated'.
    """
    if as_json and as_csv:
        raise UsageError("choose one of --json and --csv")
    paths = list(dict.fromkeys([*bundles, *isolated]))
    if not paths:
        raise UsageError("give at least one bundle to compare")
    with consumer_scope(full) as seen:
        result: Comparison = _compare_module().compare(
            paths, isolated=isolated, isolated_hosts=isolated_hosts
        )
    if as_json:
        echo_json(add_coverage(result.to_json(), seen))
    elif as_csv:
        click.echo(safe_text(result.to_csv()), nl=False)
    else:
        click.echo(safe_text(_human(result)))
    echo_notes(seen, human=not (as_json or as_csv))
