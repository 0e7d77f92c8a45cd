"""Every exception kk3evidence raises, and the CLI's exit codes.

All errors derive from :class:`Kk3Error`. Each carries a one-line ``message`` that says where
(bundle member, line, JSON path) and what to do next; the CLI prints that line and exits with
``exit_code``. Library users catch :class:`Kk3Error` (or a subclass) and never see a traceback
from bad input.
"""

from __future__ import annotations

# Exit codes (SPEC §4 and §5). They are a contract: other tools branch on them.
EXIT_OK = 0
EXIT_USAGE = 2
EXIT_FAILURE_FOUND = 3
EXIT_INVALID = 4
EXIT_SEVERAL_CHANGED = 5
EXIT_INCOMPATIBLE = 6

__all__ = [
    "EXIT_FAILURE_FOUND",
    "EXIT_INCOMPATIBLE",
    "EXIT_INVALID",
    "EXIT_OK",
    "EXIT_SEVERAL_CHANGED",
    "EXIT_USAGE",
    "BundleError",
    "CaptureError",
    "InputError",
    "Kk3Error",
    "RuleError",
    "UsageError",
]


class Kk3Error(Exception):
    """Base of every kk3evidence error; ``str(err)`` is a single line."""

    exit_code: int = EXIT_INVALID

    def __init__(self, message: str) -> None:
        # Keep it one line: the CLI prints exactly this.
        super().__init__(" ".join(message.split()))

    @property
    def message(self) -> str:
        return str(self)


class UsageError(Kk3Error):
    """The caller asked for something impossible (bad option combination, missing file name)."""

    exit_code = EXIT_USAGE


class InputError(Kk3Error):
    """An input (log file, plan, request file) cannot be read or parsed."""

    exit_code = EXIT_INVALID


class BundleError(InputError):
    """A bundle is unreadable, unsafe or invalid. ``problems`` lists every problem found."""

    def __init__(self, message: str, problems: list[object] | None = None) -> None:
        super().__init__(message)
        self.problems: list[object] = list(problems or [])


class RuleError(Kk3Error):
    """A rule file under ``rules/`` is malformed (a packaging or authoring bug)."""

    exit_code = EXIT_INVALID


class CaptureError(Kk3Error):
    """capture/seal could not start or finish (the wrapped command's own failure is not this)."""

    exit_code = EXIT_INVALID
