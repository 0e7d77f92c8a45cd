"""Helpers shared by the CLI commands: one-line errors, exit codes, output."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click

from kk3evidence.errors import EXIT_INVALID, Kk3Error

F = TypeVar("F", bound=Callable[..., Any])


def die(message: str, code: int) -> NoReturn:
    """Print ``kk3evidence: error: MESSAGE`` on stderr (one line) and exit with ``code``."""
    click.echo(f"kk3evidence: error: {' '.join(str(message).split())}", err=True)
    sys.exit(code)


def handle_errors(func: F) -> F:
    """Turn any :class:`Kk3Error` into its one-line message and exit code; never a traceback.

    An unexpected exception is a bug: one line naming it, exit 4, and the traceback only when
    ``KK3_DEBUG=1`` is set.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except Kk3Error as err:
            die(err.message, err.exit_code)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except KeyboardInterrupt:
            die("interrupted", 130)
        except BrokenPipeError:
            # Output closed early (e.g. piped into head): not an error of ours.
            sys.stderr.close()
            sys.exit(0)
        except Exception as exc:  # the last line of defence
            if os.environ.get("KK3_DEBUG") == "1":
                raise
            die(
                f"internal error ({type(exc).__name__}: {exc}); "
                "rerun with KK3_DEBUG=1 for a traceback and report it",
                EXIT_INVALID,
            )

    return wrapper  # type: ignore[return-value]


def safe_text(text: str) -> str:
    """Text from a received bundle made safe for a terminal (and encodable): control
    characters, bidi overrides and lone surrogates become visible escapes; newlines and tabs
    stay."""
    if text.replace("\n", "").replace("\t", "").isprintable():  # the usual case, at C speed
        return text
    return "".join(
        c if c.isprintable() or c in "\n\t" else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


def safe_json(text: str) -> str:
    """JSON text with every non-printable character (only ever inside strings: C1 controls,
    bidi overrides, lone surrogates) written as a ``\\uXXXX`` escape; still the same JSON."""
    if text.replace("\n", "").isprintable():  # the usual case, at C speed
        return text
    return "".join(c if c.isprintable() or c == "\n" else _json_escape(c) for c in text)


def _json_escape(c: str) -> str:
    code = ord(c)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # beyond the BMP: a surrogate pair, as JSON spells it
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def echo_json(obj: object) -> None:
    click.echo(safe_json(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False)))
