"""``kk3evidence minimize [-o PLAN] -- vllm serve ...``: minimal start command + ladder plan."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from kk3evidence.capture.vllm_env import installed_arg_table
from kk3evidence.errors import InputError, UsageError
from kk3evidence.handoff.minimize import (
    Minimized,
    PlanOptions,
    build_plan,
    minimize,
    model_context,
    plan_to_toml,
)
from kk3evidence.vllm_args import ArgTable, load_arg_table, render_shell

from ._common import echo_json, handle_errors

EPILOG = """\b
Examples:
  kk3evidence minimize -- vllm serve moonshotai/Kimi-K3 -tp 8 --trust-remote-code \\
      --enable-prefix-caching --tool-call-parser kimi_k3 --enable-auto-tool-choice
  kk3evidence minimize --file examples/kimi-k3-production.sh -o k3-plan.toml
  kk3evidence minimize --from-installed -- vllm serve MODEL ...   # vLLM's live argument list
  kk3evidence ladder k3-plan.toml -o k3-ladder/
"""


def _read_command_file(path: str) -> list[str]:
    from kk3evidence.vllm_args import _split_command_text

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror})") from None
    # The last line (joined across backslash continuations) that runs vllm is the command.
    try:
        joined = text.replace("\\\n", " ")
        for line in reversed(joined.splitlines()):
            if "vllm" in line and not line.lstrip().startswith("#"):
                return _split_command_text(line)
    except ValueError as exc:
        raise InputError(f"{path}: cannot split the command line ({exc})") from None
    raise InputError(f"{path}: no line runs vllm; give the command after --")


@click.command("minimize", epilog=EPILOG, context_settings={"allow_interspersed_args": False})
@click.option(
    "-o",
    "--plan",
    "plan_path",
    default="ladder-plan.toml",
    show_default=True,
    metavar="PLAN",
    help="Where to write the ladder plan (TOML).",
)
@click.option("--no-plan", is_flag=True, help="Only print the classification; write no plan.")
@click.option("--force", is_flag=True, help="Overwrite an existing plan file.")
@click.option(
    "--file",
    "command_file",
    metavar="SCRIPT",
    help="Read the command from a shell script or command.txt instead of after --.",
)
@click.option(
    "--from-installed",
    is_flag=True,
    help="Read vLLM's argument list from the installed vLLM (runs its Python once) instead "
    "of the shipped table.",
)
@click.option("--vllm-python", metavar="PATH", help="The Python of the vLLM environment.")
@click.option("--table", "table_file", metavar="JSON", help="A vLLM argument table file.")
@click.option(
    "--long-input-tokens",
    type=click.IntRange(1),
    help="Input length of the longer-input step [sized so that input + output cap fit the "
    "context: --max-model-len, else the model's config.json; 8192 when unknown].",
)
@click.option(
    "--large-max-tokens",
    type=click.IntRange(1),
    default=4096,
    show_default=True,
    help="Output cap of the larger-output step.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(2, 4096),
    help="Requests at once in the concurrency step [the command's --max-num-seqs, else 32].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the classification and plan as JSON.")
@click.argument("cmd", nargs=-1, metavar="-- CMD...")
@handle_errors
def command(  # noqa: PLR0917 - click passes options by keyword
    plan_path: str,
    no_plan: bool,
    force: bool,
    command_file: str | None,
    from_installed: bool,
    vllm_python: str | None,
    table_file: str | None,
    long_input_tokens: int | None,
    large_max_tokens: int,
    concurrency: int | None,
    as_json: bool,
    cmd: tuple[str, ...],
) -> None:
    """Classify every flag of a `vllm serve` command — needed to start the model, feature, load,
    multi-node, observability, business wrapper — print the minimal start command and why each
    flag was removed, and write a ladder plan that restores one variable per step in the guide's
    order: prefix caching, longer input, larger output cap, concurrency, multi-node, tool calls,
    then the remaining features and the wrapper.

    Exit 0 on success, 2 on usage errors, 4 when the command is not a vLLM serve command.
    """
    argv = _command_argv(command_file, cmd)
    table = _arg_table(argv, table_file, from_installed, vllm_python)
    mini = minimize(argv, table=table)
    plan = build_plan(
        mini,
        PlanOptions(
            long_input_tokens=long_input_tokens,
            large_max_tokens=large_max_tokens,
            concurrency=concurrency,
            model_context=model_context(str(mini.source.model) if mini.source.model else None),
        ),
    )
    wrote = None if no_plan else _write_plan(plan, Path(plan_path), force)
    if as_json:
        echo_json({**mini.to_json(), "plan_file": wrote, "plan": plan})
        return
    _print_minimal(mini, table)
    _print_plan(plan, wrote)


def _command_argv(command_file: str | None, cmd: tuple[str, ...]) -> list[str]:
    """The command after -- or from --file (one of them)."""
    if command_file and cmd:
        raise UsageError("give the command either after -- or with --file, not both")
    argv = _read_command_file(command_file) if command_file else list(cmd)
    if not argv:
        raise UsageError(
            "no command given; usage: kk3evidence minimize [OPTIONS] -- vllm serve ..."
        )
    return argv


def _arg_table(
    argv: list[str], table_file: str | None, from_installed: bool, vllm_python: str | None
) -> ArgTable:
    """--table, else the installed vLLM's (--from-installed/--vllm-python), else the shipped one."""
    if table_file:
        try:
            obj = json.loads(Path(table_file).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"{table_file}: cannot read the argument table ({exc})") from None
        return ArgTable.from_json(obj, source=table_file)
    if from_installed or vllm_python:
        return installed_arg_table(argv, vllm_python)
    return load_arg_table()


def _write_plan(plan: Mapping[str, Any], out: Path, force: bool) -> str:
    if out.exists() and not force:
        raise UsageError(f"{out} exists; pass --force to overwrite it or -o another file")
    try:
        out.write_text(plan_to_toml(plan), encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {out} ({exc.strerror})") from None
    return str(out)


def _print_minimal(mini: Minimized, table: ArgTable) -> None:
    """The minimal command, what was kept and what was removed, and why."""
    click.echo(f"vLLM arguments from: {mini.table_source} (vLLM {table.vllm_version})")
    click.echo("")
    click.echo("Minimal start command:")
    click.echo("  " + render_shell(mini.minimal))
    click.echo("")
    click.echo("Kept (needed to start the model):")
    for k in mini.kept:
        click.echo(f"  --{k.name}: {k.why}")
    if not mini.kept:
        click.echo("  (only the model)")
    click.echo("")
    click.echo("Removed (restored one variable per ladder step):")
    width = max((len(r.cls) for r in mini.removed), default=0)
    for r in mini.removed:
        click.echo(f"  {r.cls:<{width}}  --{r.name}: {r.why}")
    if not mini.removed:
        click.echo("  (nothing: the command is already minimal)")
    if mini.source.unknown:
        click.echo("")
        click.echo("Tokens vLLM would not understand: " + " ".join(mini.source.unknown))
    click.echo("")


def _print_plan(plan: Mapping[str, Any], wrote: str | None) -> None:
    """One line per ladder step, then what the plan needs and where it was written."""
    steps = plan["step"]
    click.echo(f"Ladder plan ({len(steps)} steps, one variable each):")
    for s in steps:
        rq = s["request"]
        req = (
            f"input {'~' + str(rq['input_tokens']) if rq['input_tokens'] else 'fixed'}, "
            f"max_tokens {rq['max_tokens']}, concurrency {rq['concurrency']}"
            + (f", x{rq['repeat']}" if rq["repeat"] > 1 else "")
            + (", tools" if rq["tools"] else "")
        )
        click.echo(f"  {s['id']:>2}  {s['variable']:<24} {s['from']} → {s['to']}   [{req}]")
    if plan["plan"].get("env_required"):
        need = ", ".join(plan["plan"]["env_required"])
        click.echo(f"\nThe plan refers to secrets by name: set {need} before running the ladder.")
    if wrote:
        click.echo(f"\nWrote {wrote}; run it with: kk3evidence ladder {wrote} -o ladder-run/")
