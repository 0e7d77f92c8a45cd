"""The ``kk3evidence`` command line. The only layer that prints or exits.

Each command lives in its own module ``kk3evidence/cli/_<name>.py`` exposing ``command``; the
group loads a module only when its command runs (or when help lists it), so ``--help`` and a
plain ``analyze`` start fast.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from kk3evidence._version import __version__

# name -> module (relative to this package). Order is the order shown in --help.
_COMMANDS: dict[str, str] = {
    "capture": "_capture",
    "seal": "_seal",
    "analyze": "_analyze",
    "validate": "_validate",
    "diff": "_diff",
    "check": "_check",
    "preflight": "_preflight",
    "report": "_report",
    "compare": "_compare",
    "merge": "_merge",
    "minimize": "_minimize",
    "ladder": "_ladder",
    "rules": "_rules",
    "fingerprint": "_fingerprint",
}

EPILOG = """\b
Examples:
  kk3evidence capture -o run1.tar -- vllm serve MODEL --tensor-parallel-size 8
  kk3evidence analyze run1.tar              # stages, first causal failure, consequences
  kk3evidence analyze server.log --json     # plain log files work too ('-' = stdin)
  kk3evidence validate received.tar         # schema + sha256 + safety of someone's bundle
  kk3evidence diff cluster.tar isolated.tar # did exactly one variable change?
  kk3evidence check run1.tar --recipe kimi-k3
  kk3evidence preflight -- vllm serve MODEL --tensor-parallel-size 8   # before launching
  kk3evidence report run1.tar --baseline run0.tar > handoff.md
  kk3evidence minimize -- vllm serve MODEL --enable-prefix-caching ...

\b
Exit codes: 0 ok/no failure, 2 usage, 3 failure found (analyze), 4 unreadable or
invalid input, 5 several variables changed (diff), 6 outside compatibility (check) or a
pre-flight check failed (preflight);
capture exits with the wrapped command's status (128+N when killed by signal N).
"""


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [n for n in _COMMANDS if self._load(n) is not None]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self._load(cmd_name)

    def _load(self, name: str) -> click.Command | None:
        mod_name = _COMMANDS.get(name)
        if mod_name is None:
            return None
        try:
            mod = importlib.import_module(f"{__name__}.{mod_name}")
        except ModuleNotFoundError as exc:
            # A command whose module is not written yet is simply not offered.
            if exc.name == f"{__name__}.{mod_name}":
                return None
            raise
        cmd: Any = getattr(mod, "command", None)
        return cmd if isinstance(cmd, click.Command) else None


@click.group(
    cls=_LazyGroup,
    epilog=EPILOG,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, "--version", prog_name="kk3evidence")
def main() -> None:
    """Turn vLLM start-up runs into evidence: capture a launch into a bundle, find the
    first causal failure, diff two runs, validate bundles from others, hand off."""
