"""Fixtures shared by every test module.

``realruns``: real vLLM runs kept in the repository (``tests/data/realruns``), so a plain clone
needs nothing outside it. ``skip_or_fail``: skip locally, fail under ``CI=true``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI") == "true"


def skip_or_fail(reason: str) -> None:
    """Skip locally; fail under CI=true, where every prerequisite must be present."""
    if IN_CI:
        pytest.fail(f"CI=true but a prerequisite is missing: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def realruns() -> Path:
    """Real vLLM 0.32.0 (CPU build) runs kept in the repo (tests/data/realruns/README.md)."""
    return REPO / "tests" / "data" / "realruns"
