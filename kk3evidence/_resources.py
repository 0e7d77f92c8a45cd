"""Access to the data shipped with the package: ``rules/``, ``data/`` and ``schemas/``.

In a wheel they live at ``kk3evidence/_data/{rules,data,schemas}`` (hatchling force-include) and are
read through :mod:`importlib.resources`; in a source checkout (editable install, tests) the
top-level folders of the repository are used.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path


def data_dir(name: str) -> Traversable:
    """Return the shipped folder ``name`` (``"rules"``, ``"data"`` or ``"schemas"``)."""
    packaged = resources.files("kk3evidence").joinpath("_data", name)
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parent.parent / name
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"kk3evidence data folder {name!r} is missing from this install")


def read_text(name: str, *parts: str) -> str:
    node = data_dir(name)
    for p in parts:
        node = node.joinpath(p)
    return node.read_text(encoding="utf-8")


def iter_files(name: str, suffix: str) -> list[Traversable]:
    """All files under data folder ``name`` (recursively) ending in ``suffix``, sorted by path."""
    out: list[tuple[str, Traversable]] = []

    def walk(node: Traversable, prefix: str) -> None:
        for child in node.iterdir():
            rel = f"{prefix}{child.name}"
            if child.is_dir():
                walk(child, rel + "/")
            elif child.name.endswith(suffix):
                out.append((rel, child))

    walk(data_dir(name), "")
    return [t for _, t in sorted(out, key=lambda x: x[0])]
