"""Pre-flight checks of the command's flags against the installed vLLM's argument table."""

from __future__ import annotations

from kk3evidence.handoff.preflight.model_checks import Ctx
from kk3evidence.handoff.preflight.result import Check

_PARSERS = (("tool-call-parser", "tool_call_parsers", "tool-parser-plugin"),
            ("reasoning-parser", "reasoning_parsers", "reasoning-parser-plugin"))


def _table_ev(ctx: Ctx) -> str:
    t = ctx.cmd.table
    text = f"argument table: {t.source if t else '?'} (vLLM {t.vllm_version if t else '?'})"
    installed = ctx.facts.vllm.version
    if t and installed and installed.split(".")[:2] != t.vllm_version.split(".")[:2]:
        text += f"; no table shipped for the installed vLLM {installed}: judged with this one"
    return text


def check_unknown(ctx: Ctx) -> Check:
    ev = [_table_ev(ctx)]
    if ctx.cmd.unknown:
        ev.append(f"not understood: {' '.join(ctx.cmd.unknown)}")
        return ctx.check("flags.unknown", "flags", "fail",
                         f"{len(ctx.cmd.unknown)} argument(s) the installed vLLM does not know: "
                         f"{' '.join(ctx.cmd.unknown[:4])}", ev,
                         next_step="Remove or rename them (`vllm serve --help=all` lists the "
                                   "installed vLLM's flags).")
    return ctx.check("flags.unknown", "flags", "pass",
                     f"all {len(ctx.cmd.flags)} flag(s) are known to vLLM "
                     f"{ctx.cmd.table.vllm_version if ctx.cmd.table else '?'}", ev)


def check_choices(ctx: Ctx) -> Check:
    table = ctx.cmd.table
    bad: list[str] = []
    checked = 0
    for name, value in ctx.cmd.flags.items():
        spec = table.spec(name) if table else None
        if spec is None or not spec.choices:
            continue
        checked += 1
        allowed = {str(c) for c in spec.choices}
        for v in value if isinstance(value, tuple) else (value,):
            if str(v) not in allowed:
                bad.append(f"--{name} {v} (allowed: {', '.join(sorted(allowed)[:12])})")
    ev = [_table_ev(ctx), f"flags with a fixed set of values: {checked}"]
    bad += _load_format_problems(ctx, ev)
    if bad:
        return ctx.check("flags.choices", "flags", "fail", bad[0], ev + bad[1:], "load-formats",
                         "Use a value the installed vLLM accepts (or install the package).")
    return ctx.check("flags.choices", "flags", "pass", "every value is one vLLM accepts", ev,
                     "load-formats")


def _load_format_problems(ctx: Ctx, ev: list[str]) -> list[str]:
    value = ctx.cmd.flags.get("load-format")
    if value is None:
        return []
    fact = ctx.fact("load-formats")
    known = [str(x) for x in fact.items("known")]
    packages = fact.table("packages")
    ev.append(f"--load-format: {value}")
    if str(value) not in known:
        return [f"--load-format {value} is not a load format of vLLM 0.32 "
                f"(known: {', '.join(known)})"]
    pkg = packages.get(str(value))
    if pkg is None:
        return []
    dists = ctx.facts.vllm.dists
    norm = str(pkg).lower().replace("_", "-")
    have = dists.get(norm)
    ev.append(f"package {pkg} in the server's environment: {have or 'absent'}")
    if not dists or have:
        return []
    return [f"--load-format {value} needs the Python package {pkg!r}, which is not installed "
            "in vLLM's environment"]


def check_parsers(ctx: Ctx) -> Check:
    table = ctx.cmd.table
    ev = [_table_ev(ctx)]
    problems: list[str] = []
    warn: list[str] = []
    for flag, attr, plugin in _PARSERS:
        value = ctx.cmd.flags.get(flag)
        if value is None:
            continue
        names = getattr(table, attr, ()) if table else ()
        ev.append(f"--{flag}: {value}")
        if str(value) in names:
            continue
        if ctx.cmd.flags.get(plugin):
            warn.append(f"--{flag} {value} is not built in; expected from --{plugin}")
        else:
            close = [n for n in names if str(value).split("_")[0] in n][:5]
            problems.append(f"--{flag} {value} is unknown to vLLM "
                            f"{table.vllm_version if table else '?'}"
                            + (f" (similar: {', '.join(close)})" if close else ""))
    if problems:
        return ctx.check("flags.parsers", "flags", "fail", problems[0], ev + problems[1:],
                         next_step="Use a parser name this vLLM knows (kimi_k3 needs a vLLM "
                                   "that ships it), or upgrade vLLM.")
    if warn:
        return ctx.check("flags.parsers", "flags", "warn", warn[0], ev,
                         next_step="Check that the plugin registers that name.")
    return ctx.check("flags.parsers", "flags", "pass",
                     "parser names known" if len(ev) > 1 else "no parser flags", ev)
