"""``kk3evidence report BUNDLE``: the hand-off document (Markdown, GitHub issue or HTML)."""

from __future__ import annotations

from pathlib import Path

import click

from kk3evidence.errors import InputError, UsageError
from kk3evidence.handoff.group import report_group
from kk3evidence.handoff.report.i18n import LANGS
from kk3evidence.handoff.report.markdown import FORMATS, render_report

from ._budget import consumer_scope, echo_notes, full_option, notes
from ._common import handle_errors, safe_text
from ._merge import expand


@click.command(name="report")
@click.argument("bundles", nargs=-1, required=True, type=click.Path(),
                metavar="BUNDLE [BUNDLE...]")
@click.option("--baseline", "baseline", metavar="BUNDLE", type=click.Path(),
              help="The last stable run: adds the single-variable result against it.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="markdown",
              show_default=True,
              help="markdown; github (vLLM bug-report template); html (one self-contained "
                   "file with a stage timeline); snippet (at most 40 lines to paste into an "
                   "issue: first causal line with context, stage, category, basis, "
                   "fingerprint essentials, minimal command, bundle sha256).")
@click.option("--lang", type=click.Choice(LANGS), default="en", show_default=True,
              help="Language of the hand-off (ko: Korean).")
@click.option("--recipe", metavar="NAME",
              help="Compatibility recipe to check (default: picked from the served model).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True),
              help="Write to this file instead of stdout.")
@full_option
@handle_errors
def command(  # noqa: PLR0917 - one parameter per click option
    bundles: tuple[str, ...], baseline: str | None, fmt: str, lang: str, recipe: str | None,
    output: str | None, full: bool,
) -> None:
    """Write the hand-off for BUNDLE: fingerprint table, minimal command, fixed request and
    response, first failing stage with its evidence lines, the single-variable result against
    --baseline, compatibility boundaries, the guide's 11-item checklist evaluated from the
    evidence (pass / fail / unknown and why), and the reproducibility limits of online serving.

    Several bundles of one group (or its merge archive): the group analysis (merged timeline,
    first failure with its node, consistency across nodes), then the hand-off of the node that
    failed first.
    """
    with consumer_scope(full) as seen, expand(bundles) as paths:
        if len(paths) > 1:
            if fmt != "markdown" or baseline:
                raise UsageError("a group report (several bundles) is markdown, no --baseline")
            doc = report_group(paths, lang=lang, recipe=recipe)
        else:
            doc = render_report(bundles[0], baseline=baseline, fmt=fmt,  # type: ignore[arg-type]
                                lang=lang, recipe=recipe)  # type: ignore[arg-type]
    if seen and fmt in ("markdown", "github"):
        # The hand-off itself says what its analysis covered (it is read without our stderr).
        doc += "\n" + "".join(f"> **Analysis coverage:** {n}\n" for n in notes(seen))
    echo_notes(seen)
    doc = safe_text(doc)  # received text never drives a terminal (nor fails to encode)
    if output:
        try:
            Path(output).write_text(doc, encoding="utf-8")
        except OSError as exc:
            raise InputError(f"{output}: cannot write the report ({exc.strerror})") from None
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(doc, nl=False)
