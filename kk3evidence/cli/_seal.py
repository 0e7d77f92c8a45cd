"""``kk3evidence seal STAGING [-o OUT]``: turn a dead capture's staging folder into a bundle."""

from __future__ import annotations

from pathlib import Path

import click

from kk3evidence.bundle import seal, validate
from kk3evidence.errors import BundleError

from ._common import handle_errors


@click.command(name="seal")
@click.argument("staging", metavar="STAGING")
@click.option(
    "-o",
    "--output",
    "output",
    metavar="OUT",
    default=None,
    help="Bundle to write (.tar, or .tar.gz/.tgz for gzip). Default: STAGING.tar beside it.",
)
@click.option(
    "--remove-staging", is_flag=True, help="Delete the staging folder once the bundle is written."
)
@handle_errors
def command(staging: str, output: str | None, remove_staging: bool) -> None:
    """Seal what a capture left behind when it was killed (crash recovery).

    Keeps everything captured (a cut-off last log line included), adds minimal stubs for
    launch.json / fingerprint.json if they were never written (listed under not_collected), and
    marks the manifest sealed_from_staging. Exit 0 when the bundle is written, 4 when STAGING is
    not a usable staging folder.
    """
    src = Path(staging)
    out = Path(output) if output else src.with_name(src.name.rstrip("/") + ".tar")
    path = seal(src, out, remove_staging=remove_staging)
    problems = validate(path)
    if problems:  # a bug of ours; say so rather than hand over a bad bundle silently
        raise BundleError(f"sealed bundle {path} does not validate: {problems[0]}", list(problems))
    click.echo(f"sealed {staging} -> {path}")
