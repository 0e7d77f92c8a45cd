"""Generate docs/cli.md from the click commands themselves (so it can never drift).

Run ``python -m kk3evidence.cli._docgen > docs/cli.md``; a test fails when the file is stale.
"""

from __future__ import annotations

import click

from . import main

HEADER = """# Command-line reference

Generated from the commands' own help by `python -m kk3evidence.cli._docgen > docs/cli.md`;
`tests/test_cli_docs.py` fails when this page is stale. Exit codes are a contract (SPEC §4, §5).

"""


def _help(ctx: click.Context) -> str:
    return ctx.command.get_help(ctx)


def render() -> str:
    # Contexts are chained from the root so every command sees the group's settings
    # (help option names, width) exactly as on a terminal 100 columns wide.
    settings = {**main.context_settings, "max_content_width": 100, "terminal_width": 100}
    root = click.Context(main, info_name="kk3evidence", **settings)
    parts = [HEADER, "## kk3evidence\n\n```text\n", _help(root), "\n```\n"]
    for name in main.list_commands(root):
        cmd = main.get_command(root, name)
        if cmd is None:
            continue
        ctx = click.Context(cmd, info_name=name, parent=root)
        parts += [f"\n## kk3evidence {name}\n\n```text\n", _help(ctx), "\n```\n"]
        if isinstance(cmd, click.Group):
            for sub in cmd.list_commands(ctx):
                sc = cmd.get_command(ctx, sub)
                if sc is None:
                    continue
                sub_ctx = click.Context(sc, info_name=sub, parent=ctx)
                parts += [f"\n### kk3evidence {name} {sub}\n\n```text\n", _help(sub_ctx)]
                parts.append("\n```\n")
    return "".join(parts)


if __name__ == "__main__":
    print(render(), end="")
