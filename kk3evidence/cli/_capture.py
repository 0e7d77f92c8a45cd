"""``kk3evidence capture [-o BUNDLE] [options] -- CMD...``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import click

from kk3evidence.capture.attach import AttachOptions, run_attach
from kk3evidence.capture.progress import ProgressLine
from kk3evidence.capture.run import (
    CaptureOptions,
    CaptureResult,
    main_passthrough_sinks,
    run_capture,
)
from kk3evidence.capture.watchdog import (
    DEFAULT_STAGE_BUDGETS,
    DEFAULT_STALL_AFTER,
    StallPolicy,
    parse_stall_after,
)
from kk3evidence.errors import UsageError

from ._common import handle_errors

EPILOG = """\b
Examples:
  kk3evidence capture -o run1.tar -- vllm serve MODEL --tensor-parallel-size 8
  kk3evidence capture -o run2.tar --prefix-probe --stop-after-request \\
      --change 'driver=570.86.15->580.65.06' -- vllm serve MODEL --enable-prefix-caching
  kk3evidence capture --no-probe -- torchrun --nproc-per-node 8 train.py

\b
CMD's output passes through unchanged; capture's own messages start with
'kk3evidence:' on stderr. Ctrl-C is forwarded to CMD (a second Ctrl-C kills its
process group). Exit status: CMD's (128+N when it was killed by signal N).
If capture itself is killed, run 'kk3evidence seal STAGING -o BUNDLE' on the
staging folder it named at the start.

\b
A server kk3evidence did not start (systemd, a pod spec):
  kk3evidence capture -o prod.tar --attach 4242 --log /var/log/vllm.log --url http://127.0.0.1:8000
  kubectl logs -f vllm-0 | kk3evidence capture -o pod.tar --attach PID --log - --url URL
With --attach the exit status is 0 (no failure in the log) or 3 (a failure was found).
"""


#: the HTTP readiness poll without a limit (it still ends when CMD exits)
NO_LIMIT = 10.0 * 365 * 86400


def _say(message: str) -> None:
    click.echo(f"kk3evidence: {message}", err=True)


def _say_over(line: ProgressLine | None) -> Callable[[str], None]:
    """capture's messages, erasing the progress line first."""
    if line is None:
        return _say

    def say(message: str) -> None:
        line.clear()
        _say(message)

    return say


@click.command(
    "capture",
    epilog=EPILOG,
    context_settings={"ignore_unknown_options": False, "allow_interspersed_args": False},
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Bundle to write (.tar, .tar.gz); never overwritten (an existing file is refused). "
    "Default: kk3-<UTC time>.tar here, numbered -2, -3, ... for captures of the same second.",
)
@click.option(
    "--staging",
    type=click.Path(file_okay=False, path_type=Path),
    help="Staging folder (default: BUNDLE.staging beside the bundle).",
)
@click.option("--note", "notes", multiple=True, metavar="TEXT", help="Free note (repeatable).")
@click.option(
    "--change",
    "changes",
    multiple=True,
    metavar="'VAR=FROM->TO[@WHEN]'",
    help="What changed since the previous run, e.g. 'driver=570.86.15->580.65.06'.",
)
@click.option(
    "--cluster",
    "cluster_text",
    metavar="TEXT",
    help="Cluster state in words (other jobs, maintenance); GPU processes are added.",
)
@click.option("--image", metavar="REF", help="Container image reference (wins over detection).")
@click.option("--image-id", metavar="ID", help="Container image id (wins over detection).")
@click.option(
    "--probe/--no-probe",
    "probe_http",
    default=None,
    help="Poll the HTTP API and send the fixed request (default: on for vLLM serve).",
)
@click.option("--url", metavar="URL", help="API base URL (default: from CMD's --host/--port).")
@click.option(
    "--ready-timeout",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="Stop a server not ready (/health, /v1/models) after this, with a stall snapshot "
    "first (default: wait as long as it runs).",
)
@click.option(
    "--stall-after",
    "stall_after",
    multiple=True,
    metavar="[STAGE=]SECONDS",
    help="Snapshot the process tree after this long without output or stage change "
    "(repeatable; per stage e.g. engine_init=1800; 0 = off). Default 600, engine_init=1800.",
)
@click.option(
    "--stall-action",
    type=click.Choice(["record", "stop"]),
    default="record",
    show_default=True,
    help="After a stall snapshot: keep waiting (record) or stop CMD (SIGINT, SIGTERM, SIGKILL).",
)
@click.option("--quiet", "-q", is_flag=True, help="No live progress line on stderr.")
@click.option(
    "--request",
    "request_file",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="JSON request body instead of the guide's fixed request.",
)
@click.option(
    "--endpoint",
    "request_path",
    metavar="PATH",
    help="Path for the request (default /v1/chat/completions).",
)
@click.option(
    "--repeat",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    metavar="N",
    help="Send the fixed request N times.",
)
@click.option(
    "--prefix-probe",
    is_flag=True,
    help="Send a prompt longer than one KV block twice; record prefix-cache hits.",
)
@click.option(
    "--block-size",
    type=click.IntRange(min=1),
    metavar="N",
    help="KV block size for the prefix probe (default: from /metrics or CMD).",
)
@click.option(
    "--stop-after-request",
    is_flag=True,
    help="Stop the server (SIGINT to its group) after the requests.",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(min=0.1),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="Time limit of each request.",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="How long CMD's group may outlive CMD before it is stopped.",
)
@click.option(
    "--python-timeout",
    type=click.FloatRange(min=1),
    default=120.0,
    show_default=True,
    metavar="SECONDS",
    help="Time limit of the probe of CMD's Python side (torch, vLLM versions).",
)
@click.option(
    "--group",
    metavar="ID|auto",
    help="Join the multi-node group ID (same on every node), or 'auto' to derive it from "
    "vLLM's --nnodes/--node-rank or data-parallel flags, Slurm, a LeaderWorkerSet or Ray. "
    "Default: derived when those show several nodes.",
)
@click.option(
    "--attach",
    "attach_pid",
    type=click.IntRange(min=1),
    metavar="PID",
    help="Do not start CMD: build the bundle from the running server PID (/proc fingerprint, "
    "--log, requests through --url). Never stops it.",
)
@click.option(
    "--log",
    "attach_log",
    metavar="FILE|-",
    help="With --attach: the server's log file (read from its start, then followed) or '-' "
    "for a pipe such as 'kubectl logs -f POD |'.",
)
@click.option(
    "--follow",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="With --attach: keep following the log this long after the requests.",
)
@click.option("--no-analyze", is_flag=True, help="Do not analyze the log at the end.")
@click.option("--preflight", "preflight", is_flag=True,
              help="Run `kk3evidence preflight` on CMD first and store preflight.json (CMD is "
                   "launched even when a check fails; use `preflight` alone to stop early).")
@click.option("--preflight-recipe", metavar="NAME", help="Recipe for --preflight (e.g. kimi-k3).")
@click.argument("cmd", nargs=-1, required=False, metavar="-- CMD...")
@handle_errors
def command(
    *,
    output: Path | None,
    staging: Path | None,
    notes: tuple[str, ...],
    changes: tuple[str, ...],
    cluster_text: str | None,
    image: str | None,
    image_id: str | None,
    probe_http: bool | None,
    url: str | None,
    ready_timeout: float | None,
    stall_after: tuple[str, ...],
    stall_action: str,
    quiet: bool,
    request_file: Path | None,
    request_path: str | None,
    repeat: int,
    prefix_probe: bool,
    block_size: int | None,
    stop_after_request: bool,
    request_timeout: float,
    grace: float,
    python_timeout: float,
    no_analyze: bool,
    preflight: bool,
    preflight_recipe: str | None,
    group: str | None,
    attach_pid: int | None,
    attach_log: str | None,
    follow: float,
    cmd: tuple[str, ...],
) -> None:
    """Run CMD unchanged and record it into an evidence bundle.

    Output passes through live and byte-exact; the bundle gets the fingerprint (host,
    GPUs, container, Python side, environment, loaded libraries), the command, the log
    with per-line receive times, readiness, the fixed request and /metrics, notes, and
    the analysis. Secrets are redacted before anything is written.
    """
    _check_modes(attach_pid, attach_log, cmd)
    policy = _stall_policy(stall_after, stall_action, ready_timeout, grace)
    opts = CaptureOptions(
        argv=cmd,
        output=output,
        staging=staging,
        notes=notes,
        changes=changes,
        cluster_text=cluster_text,
        image=image,
        image_id=image_id,
        probe=probe_http,
        url=url,
        ready_timeout=NO_LIMIT if ready_timeout is None else ready_timeout,
        stall=policy,
        request_file=request_file,
        request_path=request_path,
        repeat=repeat,
        prefix_probe=prefix_probe,
        block_size=block_size,
        stop_after_request=stop_after_request,
        request_timeout=request_timeout,
        grace=grace,
        python_timeout=python_timeout,
        analyze=not no_analyze,
        preflight=preflight or preflight_recipe is not None,
        preflight_recipe=preflight_recipe,
        group=group,
    )
    if attach_pid is not None:
        result = run_attach(
            AttachOptions(attach_pid, opts, log=attach_log, follow=follow), say=_say
        )
    else:
        result = _run_cmd(opts, quiet)
    for problem in result.problems:
        _say(f"warning: {problem}")
    where = f"bundle {result.bundle}" if result.bundle else f"staging folder {result.staging}"
    _say(f"{where}: {result.summary}")
    sys.exit(result.exit_status)


def _check_modes(attach_pid: int | None, attach_log: str | None, cmd: tuple[str, ...]) -> None:
    """Either CMD or --attach PID; --log only with --attach."""
    if attach_pid is None and not cmd:
        raise UsageError("capture: give -- CMD... to run, or --attach PID for a running server")
    if attach_pid is not None and cmd:
        raise UsageError("capture: --attach PID takes no CMD (the server is already running)")
    if attach_log is not None and attach_pid is None:
        raise UsageError("capture: --log is for --attach; a started CMD's output is captured")


def _stall_policy(
    stall_after: tuple[str, ...], stall_action: str, ready_timeout: float | None, grace: float
) -> StallPolicy:
    """--stall-after/--stall-action/--ready-timeout as the watchdog's policy."""
    default, per_stage = parse_stall_after(stall_after)
    budgets = dict(DEFAULT_STAGE_BUDGETS) if default is None else {}
    budgets.update(per_stage)
    return StallPolicy(
        stall_after=DEFAULT_STALL_AFTER if default is None else default,
        per_stage=budgets,
        action=stall_action,
        ready_timeout=ready_timeout,
        grace=grace,
    )


def _run_cmd(opts: CaptureOptions, quiet: bool) -> CaptureResult:
    """Start CMD with its output passed through (under the progress line unless --quiet)."""
    out, err = main_passthrough_sinks()
    line = None if quiet else ProgressLine()
    if line is not None:
        out, err = line.wrap(out), line.wrap(err)
    return run_capture(
        opts, out=out, err=err, say=_say_over(line), progress=line.show if line else None
    )
