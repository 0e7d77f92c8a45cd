"""For the repository's Python scripts: run under the project's ``.venv`` (made by
``scripts/bootstrap``) when started with another interpreter (``#!/usr/bin/env python3``
finds the system one, which lacks kk3evidence's dependencies)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def use_project_venv() -> None:
    python = REPO / ".venv" / "bin" / "python"
    if python.exists() and Path(sys.prefix).resolve() != python.parent.parent.resolve():
        os.execv(python, [str(python), *sys.argv])
