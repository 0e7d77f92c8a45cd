"""A byte-size option (``--max-bytes 8G``): plain bytes or a K/M/G/T suffix (powers of 1024)."""

from __future__ import annotations

import re

import click

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", re.IGNORECASE)
_UNIT = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


class ByteSize(click.ParamType[int]):
    """Bytes, e.g. ``0``, ``65536``, ``512M``, ``8G`` (``0``: no limit)."""

    name = "SIZE"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        m = _SIZE.fullmatch(str(value))
        if m is None:
            self.fail(f"{value!r} is not a size; give bytes or a number with K, M, G or T "
                      "(e.g. 512M, 8G; 0 for no limit)", param, ctx)
        return int(float(m.group(1)) * _UNIT[m.group(2).lower()])


def show(n: int) -> str:
    """``8 GiB``, ``512 MiB``, ``1234 bytes``: a size for messages."""
    for unit, div in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} bytes"
