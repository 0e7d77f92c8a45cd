"""``kk3evidence report BUNDLE``: the hand-off document (Markdown, GitHub issue or HTML)."""

from __future__ import annotations

from pathlib import Path

import click

from kk3evidence.errors import InputError
from kk3evidence.handoff.report.i18n import LANGS
from kk3evidence.handoff.report.markdown import FORMATS, render_report

from ._common import handle_errors


@click.command(name="report")
@click.argument("bundle", type=click.Path())
@click.option("--baseline", "baseline", metavar="BUNDLE", type=click.Path(),
              help="The last stable run: adds the single-variable result against it.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="markdown",
              show_default=True,
              help="markdown; github (vLLM bug-report template); html (one self-contained "
                   "file with a stage timeline).")
@click.option("--lang", type=click.Choice(LANGS), default="en", show_default=True,
              help="Language of the hand-off (ko: Korean).")
@click.option("--recipe", metavar="NAME",
              help="Compatibility recipe to check (default: picked from the served model).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True),
              help="Write to this file instead of stdout.")
@handle_errors
def command(  # noqa: PLR0917 - one parameter per click option
    bundle: str, baseline: str | None, fmt: str, lang: str, recipe: str | None,
    output: str | None,
) -> None:
    """Write the hand-off for BUNDLE: fingerprint table, minimal command, fixed request and
    response, first failing stage with its evidence lines, the single-variable result against
    --baseline, compatibility boundaries, the guide's 11-item checklist evaluated from the
    evidence (pass / fail / unknown and why), and the reproducibility limits of online serving.
    """
    doc = render_report(bundle, baseline=baseline, fmt=fmt,  # type: ignore[arg-type]
                        lang=lang, recipe=recipe)  # type: ignore[arg-type]
    if output:
        try:
            Path(output).write_text(doc, encoding="utf-8")
        except OSError as exc:
            raise InputError(f"{output}: cannot write the report ({exc.strerror})") from None
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(doc, nl=False)
