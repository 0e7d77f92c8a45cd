"""``kk3evidence ladder PLAN [-o DIR]``: run a plan step by step, stop where the outcome changes."""

from __future__ import annotations

import contextlib
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

from kk3evidence.capture.ladder.run import LadderResult, Plan, load_plan, run_ladder
from kk3evidence.errors import EXIT_OK

from ._common import die, echo_json, handle_errors

EPILOG = """\b
Examples:
  kk3evidence minimize -o plan.toml -- vllm serve MODEL --enable-prefix-caching ...
  kk3evidence ladder plan.toml -o ladder-run/
  kk3evidence ladder plan.toml -o ladder-run/     # again: resumes, skips finished steps
  kk3evidence ladder plan.toml --dry-run          # show the steps, start nothing

\b
Exit codes: 0 every step keeps the baseline's outcome, 3 a step changed the outcome (or the
baseline itself fails), 2 usage, 4 invalid plan, 130 interrupted (run again to resume).
"""


class Progress:
    """The ladder's display (:class:`LadderEvents`): one status line on stderr, rewritten in
    place on a terminal, one line per event else; ``--verbose`` passes the servers' output on."""

    def __init__(self, stream: Any = None, *, enabled: bool = True) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.lock = threading.Lock()
        self.prefix = ""
        self.stage = ""
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def begin(self, prefix: str) -> None:
        with self.lock:
            self.prefix = prefix
            self.stage = "starting"
            self.started = time.monotonic()
        self._line(force=True)
        if self.tty and self.enabled and self._ticker is None:
            self._stop.clear()
            self._ticker = threading.Thread(target=self._tick, name="kk3-ladder-progress")
            self._ticker.daemon = True
            self._ticker.start()

    def set_stage(self, stage: str) -> None:
        with self.lock:
            changed = stage != self.stage
            self.stage = stage
        if changed:
            self._line(force=not self.tty)

    def say(self, text: str) -> None:
        if not self.enabled:
            return
        with self.lock:
            if self.tty:
                self.stream.write("\r\x1b[2K")
            self.stream.write(f"kk3evidence ladder: {text}\n")
            self.stream.flush()

    def end(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(2)
            self._ticker = None
        if self.enabled and self.tty:
            with self.lock:
                self.stream.write("\r\x1b[2K")
                self.stream.flush()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            self._line(force=True)

    def _line(self, force: bool) -> None:
        if not self.enabled or not force:
            return
        with self.lock:
            secs = time.monotonic() - self.started
            text = f"{self.prefix} · {self.stage} · {secs:.0f} s"
            if self.tty:
                self.stream.write("\r\x1b[2K" + text[:200])
            else:
                self.stream.write(f"kk3evidence ladder: {text}\n")
            self.stream.flush()

    def server_output(self, data: bytes) -> None:
        # shown with --verbose even when --quiet turns the status line off
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.buffer.write(data)
            sys.stderr.buffer.flush()


def _print_plan(plan: Plan) -> None:
    for s in plan.steps:
        click.echo(f"step {s.id}: {s.variable} ({s.from_ or 'absent'} → {s.to})")
        click.echo(f"  {' '.join(shlex.quote(a) for a in s.argv)}")
        click.echo(f"  request: {s.request.describe()}")


def _report(plan: Plan, result: LadderResult, out_dir: Path) -> None:
    click.echo("")
    for rec in result.records:
        mark = "=" if result.changed != rec.id else "≠"
        shared = f", server of step {rec.shares_server_with}" if rec.shares_server_with else ""
        resumed = " (done earlier)" if rec.id in result.skipped else ""
        click.echo(
            f" {mark} step {rec.id} {rec.variable}: {rec.outcome.describe()}"
            f"  [{rec.bundle or 'no bundle'}{shared}]{resumed}"
        )
    click.echo("")
    click.echo(result.message)
    if result.verdict == "changed" and result.changed is not None:
        changed = next(r for r in result.records if r.id == result.changed)
        stable = next((r for r in result.records if r.id == result.last_stable), None)
        click.echo(f"  bundle of step {changed.id}: {out_dir / (changed.bundle or '?')}")
        if changed.requests_dir:
            click.echo(f"  its requests: {out_dir / changed.requests_dir}")
        for line in changed.request_summaries[:3]:
            click.echo(f"    {line}")
        if len(changed.request_summaries) > 3:
            click.echo(f"    … {len(changed.request_summaries) - 3} more")
        if stable is not None:
            step = plan.steps[stable.id]
            click.echo(
                f"  last stable baseline: step {stable.id} ({stable.variable}), bundle "
                f"{out_dir / (stable.bundle or '?')}"
            )
            click.echo("  revert to it before fixing the new failure:")
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in step.env.items())
            argv = " ".join(shlex.quote(a) for a in step.argv)
            click.echo(f"    {env + ' ' if env else ''}{argv}")
            click.echo(f"    request: {step.request.describe()}")
            if stable.bundle and changed.bundle and stable.bundle != changed.bundle:
                if result.diff_summary:
                    click.echo(f"  between the two bundles: {result.diff_summary}")
                click.echo(
                    f"  compare them: kk3evidence diff {out_dir / stable.bundle} "
                    f"{out_dir / changed.bundle}"
                )
            elif stable.bundle == changed.bundle:
                click.echo(
                    "  both ran on the same server (only the request changed): one bundle holds "
                    "both logs"
                )
    elif result.verdict == "baseline-fails" and result.records:
        first = result.records[0]
        click.echo(f"  bundle: {out_dir / (first.bundle or '?')}")
        click.echo(f"  next: kk3evidence analyze {out_dir / (first.bundle or '?')}")


@click.command("ladder", epilog=EPILOG)
@click.argument("plan_path", metavar="PLAN")
@click.option(
    "-o",
    "--out",
    "out_dir",
    metavar="DIR",
    help="Folder for the bundles and the state file [ladder-<PLAN name>].",
)
@click.option("--fresh", is_flag=True, help="Forget the steps done in DIR and start over.")
@click.option(
    "--no-reuse",
    is_flag=True,
    help="Start a new server for every step, even when only the request changes.",
)
@click.option(
    "--ready-timeout",
    type=click.FloatRange(1),
    default=1800.0,
    show_default=True,
    help="Seconds a step's server may take to answer /health and /v1/models.",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(1),
    default=600.0,
    show_default=True,
    help="Seconds one request may take.",
)
@click.option("--verbose", "-v", is_flag=True, help="Pass the servers' output through to stderr.")
@click.option("--quiet", "-q", is_flag=True, help="No progress display.")
@click.option("--dry-run", is_flag=True, help="Validate the plan and print its steps; run nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@handle_errors
def command(  # noqa: PLR0917 - click passes options by keyword
    plan_path: str,
    out_dir: str | None,
    fresh: bool,
    no_reuse: bool,
    ready_timeout: float,
    request_timeout: float,
    verbose: bool,
    quiet: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Run a ladder plan (written by `kk3evidence minimize`): each step through capture (one
    bundle per server start) with the step's request, compared with the last stable step. Stops
    at the first step whose outcome (readiness, first failure, request statuses) changes and
    names it, with its bundle and the last stable baseline to revert to.

    Steps that only change the request reuse the running server. Progress goes to stderr; the
    state is kept in DIR/ladder-state.json so running it again resumes.
    """
    plan = load_plan(plan_path)
    if dry_run:
        _print_plan(plan)
        sys.exit(EXIT_OK)
    out = Path(out_dir) if out_dir else Path(f"ladder-{Path(plan_path).stem}")
    progress = Progress(enabled=not quiet)
    try:
        result = run_ladder(
            plan,
            out,
            progress=progress,
            fresh=fresh,
            reuse_server=not no_reuse,
            ready_timeout=ready_timeout,
            request_timeout=request_timeout,
            verbose=verbose,
        )
    except KeyboardInterrupt:
        die(f"interrupted; run the same command again to resume from {out}", 130)
    if as_json:
        echo_json({**result.to_json(), "out_dir": str(out)})
    else:
        _report(plan, result, out)
    sys.exit(result.exit_code)
