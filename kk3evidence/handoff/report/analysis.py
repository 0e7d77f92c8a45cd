"""The human forms of one log's analysis: the terminal text and the markdown section.

Renderers return strings; only ``cli/`` prints them.
"""

from __future__ import annotations

from kk3evidence.analysis.hang import describe_stall
from kk3evidence.analysis.rules import load_rules
from kk3evidence.model import Analysis, FailureContext, Finding, JSONObject, RuleInfo

_MAX_CONSEQUENCES_SHOWN = 12


def _clip(text: str, width: int = 220) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _secs(value: float | None) -> str:
    if value is None:
        return "?"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min"


_NO_RULE = RuleInfo(name="", summary="", why="", next_steps=(), severity="")


def _rule_info(a: Analysis) -> RuleInfo:
    return a.extra.rule or _NO_RULE


def _context_lines(a: Analysis, ff: Finding) -> list[tuple[int, str, bool]]:
    ctx = a.extra.context or FailureContext()
    rows = [(c.line_no, c.text, False) for c in ctx.before]
    rows.append((ff.line_no, ff.text, True))
    rows += [(c.line_no, c.text, False) for c in ctx.after]
    return rows


def basis_note(ff: Finding, info: RuleInfo | None) -> str | None:
    """One sentence on how trustworthy the match is: a fallback (the rule set did not know
    this failure) or an experimental rule."""
    if ff.basis == "fallback":
        rule = load_rules().get(ff.rule)
        if rule is not None and rule.kind == "consequence":
            return (
                f"Only a line that accompanies a failure is in this log (rule {ff.rule}); the "
                "line that states the failure itself is not: look around this line, or in the "
                "part of the log that was cut."
            )
        return (
            "The rule set did not know this failure: this line is the strongest evidence "
            f"found (fallback {ff.rule}); read it with the lines around it."
        )
    if info is not None and info.status == "experimental":
        return f"Rule {ff.rule} is experimental: it was written recently and is less tested."
    return None


def spec_json(a: Analysis) -> JSONObject:
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
        f"rule {ff.rule}" + (f" ({info.name})" if info.name else "")
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
    if info.summary:
        out += ["", f"What: {info.summary}"]
    if info.why:
        out.append(f"Why:  {info.why}")
    if info.next_steps:
        out.append("Next steps:")
        out += [f"  {i}. {s}" for i, s in enumerate(info.next_steps, 1)]
    for note in a.extra.notes:
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
        f"- rule `{ff.rule}`" + (f" ({info.name})" if info.name else ""),
        f"- process: `{ff.process}`" if ff.process else "- process: (unprefixed)",
    ]
    note = basis_note(ff, info)
    if note:
        out.append(f"- {note}")
    out += ["", "```text"]
    for n, t, cur in _context_lines(a, ff):
        out.append(f"{'>' if cur else ' '} {n}: {t}")
    out += ["```", ""]
    if info.summary:
        out += [f"**What happened.** {info.summary}", ""]
    if info.why:
        out += [f"**Why it matters.** {info.why}", ""]
    if info.next_steps:
        out += ["**Next steps.**", ""] + [f"1. {s}" for s in info.next_steps] + [""]
    if a.stall:
        out += ["## Where progress stopped", "", "```text", *describe_stall(a.stall), "```", ""]
    if a.consequences:
        out += ["## Consequences", "", "| line | rule | text |", "|---|---|---|"]
        for c in a.consequences[:50]:
            text = _clip(c.text, 160).replace("|", "\\|")
            out.append(f"| {c.line_no} | `{c.rule}` | `{text}` |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"
