"""``kk3evidence analyze (BUNDLE | LOGFILE | -)``: stages, first causal failure, consequences."""

from __future__ import annotations

import sys

import click

from kk3evidence.analysis import group
from kk3evidence.analysis.budget import Budget, describe
from kk3evidence.analysis.engine import analyze
from kk3evidence.analysis.rules import RuleSet, load_rule_files
from kk3evidence.bundle.archive import BUNDLE_SUFFIXES
from kk3evidence.errors import EXIT_FAILURE_FOUND, EXIT_OK, InputError, UsageError
from kk3evidence.handoff.report.analysis import render_markdown, render_text, spec_json
from kk3evidence.model import Analysis

from ._common import echo_json, handle_errors
from ._merge import expand
from ._sizes import ByteSize

#: default cap on what one ``analyze`` reads (``--max-bytes``): a stream that never ends
#: still ends (about a minute at the measured ~200 MB/s), a real log is read whole
DEFAULT_MAX_BYTES = 8 * 1024**3


@click.command(name="analyze")
@click.argument("sources", nargs=-1, required=True, metavar="BUNDLE|LOGFILE|-  [BUNDLE...]")
@click.option("--json", "as_json", is_flag=True, help="Print the analysis JSON (SPEC §4).")
@click.option("--markdown", "as_md", is_flag=True, help="Print a markdown hand-off section.")
@click.option(
    "--context",
    "context",
    type=click.IntRange(0, 200),
    default=3,
    show_default=True,
    help="Lines of log shown before and after the first failure.",
)
@click.option(
    "--rules",
    "rule_paths",
    multiple=True,
    metavar="PATH",
    help="Extra rule file or folder of rule files (rules/*.toml format), added to the shipped "
    "rules; repeatable. For trying a new rule on a real log.",
)
@click.option(
    "--max-bytes",
    "max_bytes",
    type=ByteSize(),
    default="8G",
    show_default=True,
    help="Read at most this much of the log (K/M/G suffixes; 0: no limit). On reaching it "
    "the part read is analysed, a note on stderr and the JSON 'coverage' field say so, and "
    "the exit status is the analysis's own (0 or 3). Bounds endless input such as "
    "'analyze -' on a stream that never closes.",
)
@click.option(
    "--stopped",
    is_flag=True,
    help="The run is over where the log ends (it was killed, timed out, or died without a "
    "word): a start-up that never became ready and states no failure is then judged where "
    "its progress stopped (a hang, SPEC §2), as a bundle's launch record would let it be. "
    "Without it a plain log that ends before ready may simply be still running.",
)
@handle_errors
def command(  # noqa: PLR0917 - one parameter per click option
    sources: tuple[str, ...], as_json: bool, as_md: bool, context: int,
    rule_paths: tuple[str, ...], max_bytes: int, stopped: bool,
) -> None:
    """Find the stages a vLLM start-up passed, its first causal failure and the lines that
    only report it (consequences).

    SOURCE is a bundle (.tar, .tar.gz, .tgz), a plain log file (gzip-compressed too), or '-'
    for stdin. The log is streamed: memory stays flat however large it is.

    Several bundles of one multi-node launch (a group, see capture --group), or one group
    archive written by merge, are read as one
    run: one timeline across nodes with per-node clock offsets, the first causal failure with
    its node, the other nodes' errors as its consequences, a node x process x milestone matrix
    and a consistency check of versions, environment and argv across the nodes.

    Exit 0 when no failure is found, 3 when one is, 2 on usage errors, 4 when the input cannot
    be read.
    """
    if as_json and as_md:
        raise UsageError("--json and --markdown are exclusive; pick one output form")
    ruleset = load_rule_files(list(rule_paths), with_shipped=True) if rule_paths else None
    with expand(sources) as paths:
        if len(paths) > 1:
            if stopped:
                raise UsageError("--stopped is for one plain log; a group's bundles record "
                                 "how each node's run ended")
            _group(tuple(paths), sources, as_json=as_json, as_md=as_md, ruleset=ruleset)
            return
    budget = Budget(max_bytes, lift="--max-bytes 0") if max_bytes > 0 else None
    result = analyze(sources[0], context=context, ruleset=ruleset, budget=budget,
                     stopped=stopped)
    if result.coverage is not None:
        click.echo(f"kk3evidence analyze: note: {describe(result.coverage)}", err=True)
    if result.lines_total == 0:
        # No evidence either way: "no failure found" would read as a clean start.
        raise InputError(f"{sources[0]}: the log is empty: nothing to analyse (no failure found, "
                         "and no evidence of a clean start either); check that the right file "
                         "or bundle was given and that the program wrote to it")
    if as_json:
        echo_json(spec_json(result))
    elif as_md:
        click.echo(render_markdown(result), nl=False)
    else:
        click.echo(render_text(result), nl=False)
        if not stopped and _unfinished(result) and not sources[0].endswith(BUNDLE_SUFFIXES):
            click.echo(
                f"The log ends before the server became ready (last stage reached: "
                f"{result.last_stage_reached}, line {result.lines_total}). If the run is over, "
                "add --stopped: it is then judged where its progress stopped."
            )
    sys.exit(EXIT_FAILURE_FOUND if result.failed else EXIT_OK)


def _unfinished(result: Analysis) -> bool:
    """No failure, a start-up seen, and no ready line: maybe still running, maybe stopped."""
    return (
        result.first_failure is None
        and result.extra.ready_line is None
        and result.last_stage_reached not in (None, "api_ready", "serving")
    )


def _group(
    paths: tuple[str, ...],
    given: tuple[str, ...],
    *,
    as_json: bool,
    as_md: bool,
    ruleset: RuleSet | None,
) -> None:
    """``paths``: the node bundles (an archive's are temporary copies); ``given``: as typed."""
    if "-" in paths:
        raise UsageError("a group analysis reads bundles; '-' (stdin) is for one log")
    g = group.analyze_group(list(paths), ruleset=ruleset)
    if as_json:
        echo_json(group.to_json(g, given))
    elif as_md:
        click.echo(group.render_markdown(g), nl=False)
    else:
        click.echo(group.render_text(g), nl=False)
    sys.exit(EXIT_FAILURE_FOUND if g.failed else EXIT_OK)
