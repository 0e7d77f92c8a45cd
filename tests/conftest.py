"""Fixtures shared by every test module.

``shared_dir``: the project's ``../shared`` folder (real vLLM runs, spec). A fresh clone may not
have it: tests that need it skip, except under ``CI=true`` where a missing prerequisite fails.
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
def shared_dir() -> Path:
    d = Path(os.environ.get("KK3_SHARED_DIR", REPO.parent / "shared"))
    if not (d / "realruns").is_dir():
        skip_or_fail(f"shared folder with realruns/ not found at {d} (set KK3_SHARED_DIR)")
    return d


@pytest.fixture(scope="session")
def realruns(shared_dir: Path) -> Path:
    return shared_dir / "realruns"
