"""``kk3evidence merge -o GROUP.tar BUNDLE...``: the bundles of one group in one archive."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import click

from kk3evidence.bundle.grouparchive import (
    is_group_archive,
    opened_group_archive,
    write_group_archive,
)

from ._common import handle_errors


@contextlib.contextmanager
def expand(paths: tuple[str, ...]) -> Iterator[list[str]]:
    """One group archive stands for its node bundles; anything else is passed through."""
    if len(paths) == 1 and Path(paths[0]).is_file() and is_group_archive(paths[0]):
        with opened_group_archive(paths[0]) as nodes:
            yield nodes
    else:
        yield list(paths)


@click.command(name="merge")
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The group archive to write (a plain .tar).",
)
@click.argument(
    "bundles", nargs=-1, required=True, type=click.Path(dir_okay=False), metavar="BUNDLE BUNDLE..."
)
@handle_errors
def command(output: Path, bundles: tuple[str, ...]) -> None:
    """Put the bundles of one multi-node launch (one per node, see capture --group) into one
    group archive that analyze, report, check and diff read as the group.

    Each bundle is verified first and copied byte for byte, with its size and sha256 in the
    archive's group.json. Exit 0 when written, 4 when a bundle is invalid.
    """
    out = write_group_archive(list(bundles), output)
    click.echo(f"wrote {out} ({len(bundles)} node bundles)", err=True)
