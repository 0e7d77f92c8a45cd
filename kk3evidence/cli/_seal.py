"""``kk3evidence seal STAGING [-o OUT]``: turn a dead capture's staging folder into a bundle."""

from __future__ import annotations

import json
from pathlib import Path

import click

from kk3evidence.bundle.archive import BUNDLE_SUFFIXES, seal, validate
from kk3evidence.errors import BundleError, UsageError

from ._common import handle_errors


def default_output(staging: Path) -> Path:
    """``run.tar.staging`` (capture's name) -> ``run.tar``; any other folder X -> ``X.tar``."""
    name = staging.name
    if name.endswith(".staging") and len(name) > len(".staging"):
        name = name[: -len(".staging")]
        if name.endswith(BUNDLE_SUFFIXES):
            return staging.with_name(name)
    return staging.with_name(name + ".tar")


def still_running(staging: Path) -> str | None:
    """``"pid N: CMDLINE"`` when the process capture launched (launch.json pid) still runs the
    recorded command, else None."""
    from kk3evidence.capture.identity import cmdline

    try:
        launch = json.loads((staging / "launch.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    pid = launch.get("pid") if isinstance(launch, dict) else None
    argv = launch.get("argv") if isinstance(launch, dict) else None
    if not isinstance(pid, int) or pid <= 0 or not isinstance(argv, list) or not argv:
        return None
    now = cmdline(pid)
    # the same program still holds that pid (not a recycled pid of something else)
    if now == "?" or Path(str(argv[0])).name not in now:
        return None
    return f"pid {pid}: {now}"


@click.command(name="seal")
@click.argument("staging", metavar="STAGING")
@click.option(
    "-o",
    "--output",
    "output",
    metavar="OUT",
    default=None,
    help="Bundle to write (.tar, or .tar.gz/.tgz for gzip). Default: beside STAGING, "
    "run.tar for capture's run.tar.staging, else STAGING.tar; never overwritten.",
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
    out = Path(output) if output else default_output(src)
    if output is None and out.exists():
        raise UsageError(f"{out} already exists; choose where to write with -o OUT")
    alive = still_running(src)
    path = seal(src, out, remove_staging=remove_staging)
    problems = validate(path)
    if problems:  # a bug of ours; say so rather than hand over a bad bundle silently
        raise BundleError(f"sealed bundle {path} does not validate: {problems[0]}", list(problems))
    click.echo(f"sealed {staging} -> {path}")
    if alive:
        # The shim died, not the server: it keeps serving, and nothing records it any more.
        click.echo(f"warning: the captured server is still running ({alive}); what it printed "
                   "after capture died is not in the bundle. Stop it with "
                   f"kill -INT {alive.split()[1].rstrip(':')} (or capture it again)", err=True)
