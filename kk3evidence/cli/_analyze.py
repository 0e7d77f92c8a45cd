"""``kk3evidence analyze (BUNDLE | LOGFILE | -)``: stages, first causal failure, consequences."""

from __future__ import annotations

import sys
from typing import Any

import click

from kk3evidence.analysis import group
from kk3evidence.analysis.budget import Budget, describe
from kk3evidence.analysis.engine import analyze
from kk3evidence.analysis.hang import describe_stall
from kk3evidence.analysis.rules import RuleSet, load_rule_files
from kk3evidence.errors import EXIT_FAILURE_FOUND, EXIT_OK, InputError, UsageError
from kk3evidence.model import Analysis, Finding

from ._common import echo_json, handle_errors
from ._merge import expand
from ._sizes import ByteSize

#: default cap on what one ``analyze`` reads (``--max-bytes``): a stream that never ends
#: still ends (about a minute at the measured ~200 MB/s), a real log is read whole
DEFAULT_MAX_BYTES = 8 * 1024**3

_MAX_CONSEQUENCES_SHOWN = 12


def _clip(text: str, width: int = 220) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _secs(value: float | None) -> str:
    if value is None:
        return "?"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min"


def _rule_info(a: Analysis) -> dict[str, Any]:
    info = a.extra.get("first_failure_rule")
    return info if isinstance(info, dict) else {}


def _context_lines(a: Analysis, ff: Finding) -> list[tuple[int, str, bool]]:
    ctx = a.extra.get("first_failure_context") or {}
    rows: list[tuple[int, str, bool]] = [(int(n), str(t), False) for n, t in ctx.get("before", [])]
    rows.append((ff.line_no, ff.text, True))
    rows += [(int(n), str(t), False) for n, t in ctx.get("after", [])]
    return rows


def basis_note(ff: Finding, info: dict[str, Any]) -> str | None:
    """One sentence on how trustworthy the match is: a fallback (the rule set did not know
    this failure) or an experimental rule."""
    if ff.basis == "fallback":
        return (
            "The rule set did not know this failure: this line is the strongest evidence "
            f"found (fallback {ff.rule}); read it with the lines around it."
        )
    if info.get("status") == "experimental":
        return f"Rule {ff.rule} is experimental: it was written recently and is less tested."
    return None


def spec_json(a: Analysis) -> dict[str, Any]:
    """SPEC §4 JSON (engine extras ride on the first failure's ``findings`` entry)."""
    return a.to_json()


def _engine_numbers(a: Analysis) -> list[str]:
    """What vLLM itself reported that a next step asks for, in full."""
    cfg = a.engine_config or {}
    lines = cfg.get("lines") or {}
    out = []
    for key, label in (("estimated_max_model_len", "estimated maximum model length"),
                       ("max_model_len", "max model length the engine ran with"),
                       ("kv_cache_tokens", "KV cache tokens"),
                       ("max_concurrency", "maximum concurrency"),
                       ("enable_prefix_caching", "prefix caching (engine config)")):
        if cfg.get(key) is not None:
            out.append(f"  {label}: {cfg[key]} (line {lines.get(key, '?')})")
    return ["", "Engine reported:", *out] if out else []


def render_text(a: Analysis) -> str:
    out: list[str] = [f"{a.source}: {a.lines_total} lines"]
    out.append("")
    out.append("Stages (seed order):")
    if not a.stages:
        out.append("  (no stage evidence found)")
    for s in a.stages:
        mark = {"completed": "completed", "failed": "FAILED", "started": "started"}[s.status]
        took = f"  {_secs(s.seconds)} from +{_secs(s.started_s)}" if s.seconds is not None else ""
        out.append(f"  {s.stage:<17} {mark:<10} lines {s.first_line}-{s.last_line}{took}")
    out.append(f"Last stage reached: {a.last_stage_reached or 'none'}")
    out.append("")
    ff = a.first_failure
    if ff is None:
        out.append("No failure found.")
        return "\n".join(out) + "\n"
    info = _rule_info(a)
    out.append(
        f"First causal failure: line {ff.line_no}, stage {ff.stage}, category {ff.category}, "
        f"rule {ff.rule}" + (f" ({info['name']})" if info.get("name") else "")
    )
    if ff.process:
        out.append(f"  process: {ff.process}")
    if ff.ranks:
        out.append(f"  printed by {len(ff.ranks)} ranks/processes: {', '.join(ff.ranks)}")
    note = basis_note(ff, info)
    if note:
        out.append(f"  {note}")
    width = len(str(max(n for n, _t, _c in _context_lines(a, ff))))
    for n, t, cur in _context_lines(a, ff):
        # The first causal line is never cut: its numbers are what the next steps ask for.
        out.append(f"  {'>' if cur else ' '} {n:>{width}} | {t if cur else _clip(t)}")
    out += _engine_numbers(a)
    if info.get("summary"):
        out += ["", f"What: {info['summary']}"]
    if info.get("why"):
        out.append(f"Why:  {info['why']}")
    if info.get("next_steps"):
        out.append("Next steps:")
        out += [f"  {i}. {s}" for i, s in enumerate(info["next_steps"], 1)]
    for note in a.extra.get("notes", []):
        out.append(f"Note: {note}")
    if a.stall:
        out += ["", *(_clip(x, 300) for x in describe_stall(a.stall))]
    if a.consequences:
        out += ["", f"Consequences ({len(a.consequences)}; they only report the failure above):"]
        for c in a.consequences[:_MAX_CONSEQUENCES_SHOWN]:
            also = f" (x{len(c.ranks)} ranks)" if c.ranks else ""
            out.append(f"  line {c.line_no:<6} {c.rule:<9} {_clip(c.text, 160)}{also}")
        if len(a.consequences) > _MAX_CONSEQUENCES_SHOWN:
            out.append(f"  ... {len(a.consequences) - _MAX_CONSEQUENCES_SHOWN} more (see --json)")
    others = [f for f in a.findings if f.kind == "failure" and f.line_no != ff.line_no]
    if others:
        out += ["", f"Other failures found later ({len(others)}):"]
        for f in others[:_MAX_CONSEQUENCES_SHOWN]:
            out.append(f"  line {f.line_no:<6} {f.rule:<9} {_clip(f.text, 160)}")
    return "\n".join(out) + "\n"


def render_markdown(a: Analysis) -> str:
    out: list[str] = [f"# Analysis of `{a.source}`", ""]
    out.append(f"{a.lines_total} lines; last stage reached: **{a.last_stage_reached or 'none'}**.")
    out += ["", "## Stages", "", "| stage | status | lines | time in stage |", "|---|---|---|---|"]
    for s in a.stages:
        took = _secs(s.seconds) if s.seconds is not None else ""
        out.append(f"| {s.stage} | {s.status} | {s.first_line}–{s.last_line} | {took} |")
    out.append("")
    ff = a.first_failure
    if ff is None:
        out += ["## Result", "", "No failure found."]
        return "\n".join(out) + "\n"
    info = _rule_info(a)
    out += [
        "## First causal failure",
        "",
        f"- line **{ff.line_no}**, stage **{ff.stage}**, category **{ff.category}**",
        f"- rule `{ff.rule}`" + (f" ({info['name']})" if info.get("name") else ""),
        f"- process: `{ff.process}`" if ff.process else "- process: (unprefixed)",
    ]
    note = basis_note(ff, info)
    if note:
        out.append(f"- {note}")
    out += ["", "```text"]
    for n, t, cur in _context_lines(a, ff):
        out.append(f"{'>' if cur else ' '} {n}: {t}")
    out += ["```", ""]
    if info.get("summary"):
        out += [f"**What happened.** {info['summary']}", ""]
    if info.get("why"):
        out += [f"**Why it matters.** {info['why']}", ""]
    if info.get("next_steps"):
        out += ["**Next steps.**", ""] + [f"1. {s}" for s in info["next_steps"]] + [""]
    if a.stall:
        out += ["## Where progress stopped", "", "```text", *describe_stall(a.stall), "```", ""]
    if a.consequences:
        out += ["## Consequences", "", "| line | rule | text |", "|---|---|---|"]
        for c in a.consequences[:50]:
            text = _clip(c.text, 160).replace("|", "\\|")
            out.append(f"| {c.line_no} | `{c.rule}` | `{text}` |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


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
@handle_errors
def command(  # noqa: PLR0917 - one parameter per click option
    sources: tuple[str, ...], as_json: bool, as_md: bool, context: int,
    rule_paths: tuple[str, ...], max_bytes: int,
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
            _group(tuple(paths), sources, as_json=as_json, as_md=as_md, ruleset=ruleset)
            return
    budget = Budget(max_bytes, lift="--max-bytes 0") if max_bytes > 0 else None
    result = analyze(sources[0], context=context, ruleset=ruleset, budget=budget)
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
    sys.exit(EXIT_FAILURE_FOUND if result.failed else EXIT_OK)


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
