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


def _help(cmd: click.Command, path: list[str]) -> str:
    ctx = click.Context(cmd, info_name=" ".join(path), max_content_width=100, terminal_width=100)
    return cmd.get_help(ctx)


def render() -> str:
    parts = [HEADER, "## kk3evidence\n\n```text\n", _help(main, ["kk3evidence"]), "\n```\n"]
    ctx = click.Context(main, info_name="kk3evidence")
    for name in main.list_commands(ctx):
        cmd = main.get_command(ctx, name)
        if cmd is None:
            continue
        parts += [f"\n## kk3evidence {name}\n\n```text\n", _help(cmd, ["kk3evidence", name])]
        parts.append("\n```\n")
        if isinstance(cmd, click.Group):
            sub_ctx = click.Context(cmd, info_name=name, parent=ctx)
            for sub in cmd.list_commands(sub_ctx):
                sc = cmd.get_command(sub_ctx, sub)
                if sc is None:
                    continue
                parts += [f"\n### kk3evidence {name} {sub}\n\n```text\n"]
                parts += [_help(sc, ["kk3evidence", name, sub]), "\n```\n"]
    return "".join(parts)


if __name__ == "__main__":
    print(render(), end="")
